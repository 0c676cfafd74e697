"""The 60-second cache of the organization part of the dossier, invalidated across processes.

Every write to the dossier's organization tables fires ``pg_notify('contextcore_dossier',
<organization id>)`` (migration 00003). :class:`DossierInvalidator` LISTENs on a dedicated
connection in every process and drops that organization's entry, so a write made by any
process, or by hand in ``psql``, is seen by the next build everywhere, not only by the writer.

Two races are closed:

* a read that started before an invalidation must not store what it read: each organization
  has a generation, bumped by every invalidation, and ``put`` only stores when the generation
  is the one seen before the read;
* while the listener is down (before it started, or after its connection dropped) nothing is
  cached at all, because a missed notification would serve stale rows for up to a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar
from uuid import UUID

import asyncpg

log = logging.getLogger("contextcore.dossier")

CHANNEL = "contextcore_dossier"
T = TypeVar("T")


class DossierCache(Generic[T]):
    def __init__(self, *, ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self.listening = False
        self._entries: dict[UUID, tuple[float, T]] = {}
        self._generations: dict[UUID, int] = {}

    def generation(self, organization_id: UUID) -> int:
        return self._generations.get(organization_id, 0)

    def get(self, organization_id: UUID) -> T | None:
        entry = self._entries.get(organization_id)
        if entry is None or not self.listening:
            return None
        stored_at, value = entry
        if self.clock() - stored_at >= self.ttl_s:
            del self._entries[organization_id]
            return None
        return value

    def put(self, organization_id: UUID, value: T, *, generation: int) -> None:
        if self.listening and generation == self.generation(organization_id):
            self._entries[organization_id] = (self.clock(), value)

    def invalidate(self, organization_id: UUID) -> None:
        self._generations[organization_id] = self.generation(organization_id) + 1
        self._entries.pop(organization_id, None)

    def clear(self) -> None:
        for organization_id in list(self._entries):
            self.invalidate(organization_id)


class DossierInvalidator:
    """LISTENs for dossier writes on its own connection and invalidates ``cache``."""

    def __init__(self, cache: DossierCache[Any], database_url: str) -> None:
        self.cache = cache
        self.database_url = database_url
        self._conn: asyncpg.Connection | None = None

    async def start(self) -> None:
        self._conn = await asyncpg.connect(self.database_url)
        self._conn.add_termination_listener(self._on_termination)
        await self._conn.add_listener(CHANNEL, self._on_notify)
        self.cache.listening = True

    async def stop(self) -> None:
        self.cache.listening = False
        self.cache.clear()
        if self._conn is not None:
            self._conn.remove_termination_listener(self._on_termination)  # a chosen close
            await self._conn.close()
            self._conn = None

    def _on_notify(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        pid: int,
        channel: str,
        payload: object,
    ) -> None:
        try:
            self.cache.invalidate(UUID(str(payload)))
        except ValueError:
            log.warning("ignoring a malformed dossier notification %r", payload)

    def _on_termination(self, conn: object) -> None:
        log.warning("dossier listener connection closed: caching is off until restarted")
        self.cache.listening = False
        self.cache.clear()
