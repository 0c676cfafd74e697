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
    """The quotas as the build consumer reads them, on a record's receipt (its fetch loop):
    one statement per organization, kept ``ttl_s``; past it, the quotas known are served while
    one read refreshes them in the background, so a known organization never waits for the
    database. An organization never read waits for its first read, at most ``timeout_s``. At
    most ``max_organizations`` are kept (the least recently used forgotten).

    A read that fails, whatever the reason (the database away or slow, a migration not yet
    applied), leaves the last quotas known (none, for an organization never read) until the
    next attempt ``ttl_s`` later, and is logged then: a quota is a fairness rule, and a build
    that reads its sources from the same database fails on its own if the database is gone."""

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
        self._refreshing: dict[UUID, asyncio.Task[Quotas]] = {}

    async def quotas(self, organization_id: UUID) -> Quotas:
        known = self._known.get(organization_id)
        if known is None:
            return await self._read(organization_id, NO_QUOTAS)
        self._known.move_to_end(organization_id)
        stale = self.clock() - known[1] >= self.ttl_s
        if stale and organization_id not in self._refreshing:
            task = asyncio.create_task(self._read(organization_id, known[0]))
            self._refreshing[organization_id] = task
            task.add_done_callback(lambda _: self._refreshing.pop(organization_id, None))
        return known[0]

    async def _read(self, organization_id: UUID, fallback: Quotas) -> Quotas:
        try:
            async with asyncio.timeout(self.timeout_s):
                rows = await self.database.read(READ_QUOTAS, organization_id)
            found = Quotas.of(rows[0]) if rows else NO_QUOTAS
        except Exception as error:  # see the class docstring: the service goes on
            log.warning("the quotas of %s could not be read: %r", organization_id, error)
            found = fallback
        self._known[organization_id] = (found, self.clock())
        self._known.move_to_end(organization_id)
        while len(self._known) > self.max_organizations:
            self._known.popitem(last=False)
        return found
