"""The tenancy layer: the one door through which every organization-scoped read goes.

``TenantDatabase.scoped(organization_id)`` opens a read-only transaction that

1. switches to the service role (``SET LOCAL ROLE contextcore_app``, through ``set_config``),
   which owns no table, so row-level security applies to every read;
2. sets ``contextcore.organization_id`` for the transaction, the key of every RLS policy;
3. hands out a :class:`TenantConnection` whose queries receive the organization id as ``$1``.
   A :class:`TenantQuery` must filter by ``$1``; a query that forgot to would still see only
   this tenant's rows, because of (1) and (2).

There is no way to call it without an organization id: the id is a required ``UUID``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg

from contextcore.errors import InfrastructureUnavailable

_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
SERVICE_ROLE = "contextcore_app"

# Enter a tenant scope: become the service role and name the organization, for this transaction.
_ENTER_SCOPE = """
SELECT set_config('role', $1, true), set_config('contextcore.organization_id', $2, true)
"""


@dataclass(frozen=True)
class TenantQuery:
    """A named, commented SQL read. ``$1`` is always the organization id.

    Raises:
        ValueError: the SQL does not use ``$1`` (it could not be filtering by the tenant).
    """

    name: str
    sql: str

    def __post_init__(self) -> None:
        if not re.search(r"\$1(?!\d)", self.sql):
            raise ValueError(f"tenant query {self.name!r} does not filter by $1 (the organization)")


class TenantConnection:
    """A connection bound to one organization for one transaction."""

    def __init__(
        self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy, organization_id: UUID
    ) -> None:
        self._conn = conn
        self.organization_id = organization_id

    async def fetch(self, query: TenantQuery, *args: Any) -> list[asyncpg.Record]:
        return list(await self._conn.fetch(query.sql, self.organization_id, *args))

    async def fetchrow(self, query: TenantQuery, *args: Any) -> asyncpg.Record | None:
        return await self._conn.fetchrow(query.sql, self.organization_id, *args)


class TenantDatabase:
    """Scoped, read-only access to a pool (the primary, or a read replica)."""

    def __init__(self, pool: asyncpg.Pool | None, *, role: str = SERVICE_ROLE) -> None:
        """``pool`` may be ``None`` where sources are only declared (``contextcore policy
        check``): opening a scope then fails with :class:`InfrastructureUnavailable`."""
        if not _ROLE_NAME.match(role):
            raise ValueError(f"not a plain role name: {role!r}")
        self.pool = pool
        self.role = role

    @asynccontextmanager
    async def scoped(self, organization_id: UUID) -> AsyncIterator[TenantConnection]:
        if not isinstance(organization_id, UUID):
            raise TypeError("a tenant scope needs the organization id as a UUID")
        if self.pool is None:
            raise InfrastructureUnavailable("this process has no database pool")
        async with self.pool.acquire() as conn, conn.transaction(readonly=True):
            # One round trip: set_config('role', …, true) is SET LOCAL ROLE, with the same
            # membership check; both settings end with the transaction.
            await conn.execute(_ENTER_SCOPE, self.role, str(organization_id))
            yield TenantConnection(conn, organization_id)
