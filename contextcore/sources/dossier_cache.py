"""The 60-second cache of the organization part of the dossier, invalidated across processes.

Every write to the dossier's organization tables fires ``pg_notify('contextcore_dossier',
<organization id>)`` (migration 00003). :class:`DossierInvalidator` LISTENs on a dedicated
connection in every process and drops that organization's entry, so a write made by any
process, or by hand in ``psql``, is seen by the next build everywhere, not only by the writer.

Two races are closed:

* a read that started before an invalidation must not store what it read: each organization
  has a generation, bumped by every invalidation, and ``put`` only stores when the generation
  is the one seen before the read;
* while the listener is down (before it started, or after its connection dropped and until it
  reconnects) nothing is cached at all: a missed notification would serve stale rows for up to
  a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    """LISTENs for dossier writes on its own connection and invalidates ``cache``.

    A lost connection turns caching off at once and reconnects in the background (back-off from
    ``reconnect_delay_s`` to 30 s); caching resumes once the LISTEN is back, never before.
    """

    def __init__(
        self, cache: DossierCache[Any], database_url: str, *, reconnect_delay_s: float = 0.5
    ) -> None:
        self.cache = cache
        self.database_url = database_url
        self.reconnect_delay_s = reconnect_delay_s
        self._conn: asyncpg.Connection | None = None
        self._reconnect: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        self._stopped = False
        await self._connect()

    async def stop(self) -> None:
        self._stopped = True
        self.cache.listening = False
        self.cache.clear()
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
            self._reconnect = None
        if self._conn is not None:
            self._conn.remove_termination_listener(self._on_termination)  # a chosen close
            await self._conn.close()
            self._conn = None

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.database_url)
        conn.add_termination_listener(self._on_termination)
        await conn.add_listener(CHANNEL, self._on_notify)
        self._conn = conn
        self.cache.listening = True

    async def _reconnect_until_listening(self) -> None:
        delay = self.reconnect_delay_s
        while not self._stopped:
            try:
                await self._connect()
            except (TimeoutError, OSError, asyncpg.PostgresError) as error:
                log.warning(
                    "dossier listener: reconnect failed (%s); retrying in %.1f s", error, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                log.warning("dossier listener reconnected: caching is back on")
                return

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
        log.warning("dossier listener connection lost: caching is off until it reconnects")
        self.cache.listening = False
        self.cache.clear()
        self._conn = None
        if not self._stopped and (self._reconnect is None or self._reconnect.done()):
            self._reconnect = asyncio.get_running_loop().create_task(
                self._reconnect_until_listening()
            )
