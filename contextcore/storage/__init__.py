"""PostgreSQL + pgvector through asyncpg: the connection pool, the migrations and the ledgers."""
