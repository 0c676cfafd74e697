"""The database at a consumer's start-up: the schema checked, then the pool opened.

Start-up fails closed: the schema must match the code's migrations, checked as the service role
(the only privilege the runtime login has), before a pool is opened and a record fetched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import asyncpg

from contextcore.storage import migrations
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.positions import WritePosition, write_position
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import TenantDatabase
from schemas.errors import SchemaError


async def verify_schema(database: DatabaseSettings) -> None:
    conn = await connect(database.require_url(), timeout_s=database.connect_timeout_s)
    try:
        await migrations.verify(conn, role=database.role)
    except SchemaError as error:
        raise SchemaError([f"refusing to serve: {p}" for p in error.problems]) from error
    finally:
        await conn.close()


@asynccontextmanager
async def verified_pool(
    database: DatabaseSettings, *, url: str | None = None, opened: int = 1
) -> AsyncIterator[asyncpg.Pool]:
    """A pool on ``url`` (default: the runtime login's) once the schema is verified. Its
    connections are the service role for their whole session, so a scoped read is one
    statement (:meth:`~contextcore.storage.tenancy.TenantDatabase.read`). ``opened``
    connections open before it is handed out (at most the pool's size): a connection opened
    during a burst costs its request the connection and authentication (measured: the first
    second at 200 builds a second waited up to 240 ms while the pool grew from one)."""
    await verify_schema(database)
    pool = await create_pool(
        url or database.require_url(),
        timeout_s=database.connect_timeout_s,
        min_size=min(opened, database.pool_size),
        max_size=database.pool_size,
        session_role=database.role,
    )
    try:
        yield pool
    finally:
        await pool.close()


@dataclass(frozen=True)
class HandlerDatabase:
    """What a writing handler holds of the database: the pool, the tenancy layer over it, and
    the position of what it wrote (read-your-writes, docs/scaling.md)."""

    pool: asyncpg.Pool
    tenants: TenantDatabase
    position: WritePosition


@asynccontextmanager
async def handler_database(database: DatabaseSettings) -> AsyncIterator[HandlerDatabase]:
    """:func:`verified_pool` on the runtime login, as a :class:`HandlerDatabase`."""
    async with verified_pool(database) as pool:
        yield HandlerDatabase(
            pool, TenantDatabase(pool, role=database.role), partial(write_position, pool)
        )
