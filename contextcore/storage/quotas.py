"""The quotas in PostgreSQL (migration 00038): the named SQL that reads them and takes an
organization's quota lock, and :class:`DatabaseQuotas`, the build consumer's cached reader."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from uuid import UUID

from contextcore.quotas import NO_QUOTAS, Quotas
from contextcore.storage.tenancy import ScopedRead, TenantDatabase, TenantQuery
from schemas.errors import InfrastructureUnavailable

log = logging.getLogger("contextcore.quotas")

QUOTAS = TenantQuery(
    "quotas.in_force",
    """
-- quotas.in_force: the quotas of the transaction's organization, each its own or the default
-- (00038); one row, nulls where there is no limit
SELECT * FROM contextcore_quotas($1)
""",
)

READ_QUOTAS = ScopedRead(
    "quotas.read",
    "-- quotas.read: QUOTAS in one statement outside a transaction (00038)\n"
    "SELECT * FROM contextcore_read_quotas($1)",
)

LOCK_ORGANIZATION = TenantQuery(
    "quotas.lock_organization",
    """
-- quotas.lock_organization: the organization's quota lock, until the transaction ends, so two
-- uploads of one organization check and take the room left one after the other; the key pair
-- (1835363661, hashtext(organization)), beside 00037's memory locks (1835363660, ...)
SELECT pg_advisory_xact_lock(1835363661, hashtext($1::uuid::text))
""",
)


class DatabaseQuotas:
    """The quotas as the build consumer reads them: one statement per organization, kept
    ``ttl_s`` (a change takes effect within that), at most ``max_organizations`` kept (the least
    recently used forgotten). A database that cannot answer (within ``timeout_s``: the build
    consumer reads them on a record's receipt, in its fetch loop) leaves the last quotas known
    (none, for an organization never read): a quota is a fairness rule, and a build that reads its
    sources from the same database fails on its own if the database is gone."""

    def __init__(
        self,
        database: TenantDatabase,
        *,
        ttl_s: float = 5.0,
        timeout_s: float = 0.5,
        max_organizations: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.database = database
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.max_organizations = max_organizations
        self.clock = clock
        self._known: OrderedDict[UUID, tuple[Quotas, float]] = OrderedDict()

    async def quotas(self, organization_id: UUID) -> Quotas:
        now = self.clock()
        known = self._known.pop(organization_id, None)
        if known is not None and now - known[1] < self.ttl_s:
            self._known[organization_id] = known
            return known[0]
        try:
            async with asyncio.timeout(self.timeout_s):
                rows = await self.database.read(READ_QUOTAS, organization_id)
            found = (Quotas.of(rows[0]) if rows else NO_QUOTAS), now
        except (InfrastructureUnavailable, TimeoutError) as error:
            log.warning("the quotas of %s could not be read: %s", organization_id, error)
            found = (known[0] if known else NO_QUOTAS), now
        self._known[organization_id] = found
        while len(self._known) > self.max_organizations:
            self._known.popitem(last=False)
        return found[0]
