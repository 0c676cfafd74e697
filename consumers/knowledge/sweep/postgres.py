"""The sweep's tables in PostgreSQL: the :class:`~consumers.knowledge.sweep.app.SweepStore` the
sweep runs on in production. A connection of its own per sweep, the runtime login taking the
service role in each statement's transaction; every statement is a SECURITY DEFINER function of
the schema owner (contextcore/knowledge/adapters/store.py, indexes.py, contextcore/storage/
ledger.py, consumers/runtime/journal.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg

from consumers.runtime import journal
from contextcore.knowledge.adapters import indexes, store
from contextcore.storage import ledger
from contextcore.storage.pool import connect
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import service_role


class PostgresSweepSession:
    """One sweep's statements on one connection, each as ``role``."""

    def __init__(self, conn: asyncpg.Connection, role: str) -> None:
        self.conn = conn
        self.role = role

    async def fail_stale(self, older_than: timedelta, batch: int) -> list[store.Swept]:
        return await store.sweep(self.conn, older_than=older_than, batch=batch, role=self.role)

    async def source_counts(self) -> store.SourceCounts:
        return await store.source_counts(self.conn, role=self.role)

    async def unindexed_tenants(self, min_chunks: int) -> int:
        async with service_role(self.conn, role=self.role):
            return await indexes.unindexed_tenants(self.conn, min_chunks)

    async def prune_ledger(self, older_than: timedelta, batch: int) -> int:
        return await ledger.prune(self.conn, older_than=older_than, batch=batch, role=self.role)

    async def prune_journal(self, older_than: timedelta, batch: int) -> int:
        return await journal.prune(self.conn, older_than=older_than, batch=batch, role=self.role)


class PostgresSweepStore:
    """Opens a connection of ``database`` (the runtime login) for each sweep, closed after it.

    Raises (from :meth:`session`):
        InfrastructureUnavailable: no connection within the database's connect timeout.
        ConfigurationError: the server refuses the login.
    """

    def __init__(self, database: DatabaseSettings) -> None:
        self.database = database

    @asynccontextmanager
    async def session(self) -> AsyncIterator[PostgresSweepSession]:
        database = self.database
        conn = await connect(database.require_url(), timeout_s=database.connect_timeout_s)
        try:
            yield PostgresSweepSession(conn, database.role)
        finally:
            await conn.close()
