"""Per-organization caches of slowly changing source data, invalidated across processes.

A write to a cached table fires ``pg_notify(<channel>, <organization id>)`` (the dossier's
tables: migration 00003; definitions: 00030), or an empty payload when a platform row changed
(every organization's entry may hold it). :class:`CacheInvalidator` LISTENs on a dedicated
connection in every process and drops the entries named, so a write made by any process, or by
hand in ``psql``, is seen by the next build everywhere, not only by the writer.

Invariants:

* **Keyed by organization.** Every key starts with the organization id, and a read names its
  organization: no entry of one organization can answer another's read.
* **Bounded.** At most ``max_entries`` entries (the least recently used go first), each for at
  most ``ttl_s``.
* **A read that started before an invalidation does not store what it read:** each organization
  has a generation, the cache-wide number of its latest invalidation, and ``put`` only stores
  when the generation is the one seen before the read.
* **Notifications cost bounded memory.** The generations of at most ``max_generations``
  organizations are kept (the least recently invalidated go first); an organization without
  one has the *floor*, the greatest generation forgotten. A read that began before its
  organization's invalidation then still never stores: that organization's generation, kept
  or forgotten into the floor, is past any it could have seen. Each notified id was kept
  forever before, and a flood of notifications naming ids (a million ``pg_notify`` calls took
  a build consumer from 311 to 481 MB) grew every process that listens (issue 32). The price of
  a forgotten one: a read in flight for another organization may be refused a ``put`` (a miss,
  never a stale entry).
* **While the listener is down** (before it started, or after its connection dropped and until
  it reconnects) nothing is cached at all: a missed notification would serve stale rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar
from uuid import UUID

import asyncpg

log = logging.getLogger("contextcore.cache")

T = TypeVar("T")

Generation = tuple[int, int]
"""The cache's epoch (bumped by :meth:`TenantCache.clear`) and the organization's own count."""


class TenantCache(Generic[T]):
    def __init__(
        self,
        name: str,
        *,
        ttl_s: float = 60.0,
        max_entries: int = 10_000,
        max_generations: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("a cache holds at least one entry")
        if max_generations < 1:
            raise ValueError("a cache keeps at least one generation")
        self.name = name
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_generations = max_generations
        self.clock = clock
        self.listening = False
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[UUID, Hashable], tuple[float, T]] = OrderedDict()
        self._keys: dict[UUID, set[Hashable]] = {}
        self._generations: OrderedDict[UUID, int] = OrderedDict()
        self._invalidations = 0
        """The cache-wide count of invalidations: each one's number is its organization's
        generation."""
        self._floor = 0
        """The greatest generation forgotten: that of every organization without its own."""
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, organization_id: UUID) -> bool:
        """Whether any entry of this organization is held (expired ones included)."""
        return organization_id in self._keys

    def generation(self, organization_id: UUID) -> Generation:
        """Take it before the read whose result you will ``put``."""
        return self._epoch, self._generations.get(organization_id, self._floor)

    def get(self, organization_id: UUID, key: Hashable = None) -> T | None:
        entry = self._entries.get((organization_id, key)) if self.listening else None
        if entry is not None and self.clock() - entry[0] >= self.ttl_s:
            self._drop(organization_id, key)
            entry = None
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((organization_id, key))
        return entry[1]

    def put(
        self, organization_id: UUID, value: T, *, generation: Generation, key: Hashable = None
    ) -> None:
        if not self.listening or generation != self.generation(organization_id):
            return
        self._entries[(organization_id, key)] = (self.clock(), value)
        self._entries.move_to_end((organization_id, key))
        self._keys.setdefault(organization_id, set()).add(key)
        while len(self._entries) > self.max_entries:
            (oldest, oldest_key), _ = next(iter(self._entries.items()))
            self._drop(oldest, oldest_key)

    def invalidate(self, organization_id: UUID) -> None:
        self._invalidations += 1
        self._generations[organization_id] = self._invalidations
        self._generations.move_to_end(organization_id)
        while len(self._generations) > self.max_generations:
            _, forgotten = self._generations.popitem(last=False)
            self._floor = max(self._floor, forgotten)
        for key in self._keys.pop(organization_id, set()):
            self._entries.pop((organization_id, key), None)

    def clear(self) -> None:
        """Every organization's entries, and every read in flight, are out of date."""
        self._epoch += 1
        self._entries.clear()
        self._keys.clear()
        self._generations.clear()  # the new epoch outdates every earlier generation

    def _drop(self, organization_id: UUID, key: Hashable) -> None:
        self._entries.pop((organization_id, key), None)
        keys = self._keys.get(organization_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[organization_id]


MALFORMED_LOG_INTERVAL_S = 60.0


class CacheInvalidator:
    """LISTENs on each cache's channel on its own connection and invalidates that cache.

    A lost connection turns caching off at once and reconnects in the background (back-off from
    ``reconnect_delay_s`` to 30 s); caching resumes once the LISTEN is back, never before.
    """

    def __init__(
        self,
        caches: Mapping[str, TenantCache[Any]],
        database_url: str,
        *,
        reconnect_delay_s: float = 0.5,
    ) -> None:
        self.caches = dict(caches)
        self.database_url = database_url
        self.reconnect_delay_s = reconnect_delay_s
        self._conn: asyncpg.Connection | None = None
        self._reconnect: asyncio.Task[None] | None = None
        self._stopped = False
        self._malformed = 0
        """Malformed notifications not logged yet: any login may NOTIFY, 8 KB a call, and
        5,000 calls grew a consumer's log by 41 MB (issue 32); one line a minute says them."""
        self._malformed_logged_at = float("-inf")
        self.clock: Callable[[], float] = time.monotonic

    async def start(self) -> None:
        self._stopped = False
        await self._connect()

    async def stop(self) -> None:
        self._stopped = True
        self._listening(False)
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
            self._reconnect = None
        if self._conn is not None:
            self._conn.remove_termination_listener(self._on_termination)  # a chosen close
            await self._conn.close()
            self._conn = None

    def _listening(self, on: bool) -> None:
        for cache in self.caches.values():
            cache.listening = on
            if not on:
                cache.clear()

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.database_url)
        conn.add_termination_listener(self._on_termination)
        for channel in self.caches:
            await conn.add_listener(channel, self._on_notify)
        self._conn = conn
        self._listening(True)

    async def _reconnect_until_listening(self) -> None:
        delay = self.reconnect_delay_s
        while not self._stopped:
            try:
                await self._connect()
            except (TimeoutError, OSError, asyncpg.PostgresError) as error:
                log.warning(
                    "cache listener: reconnect failed (%s); retrying in %.1f s", error, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                log.warning("cache listener reconnected: caching is back on")
                return

    def _on_notify(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        pid: int,
        channel: str,
        payload: object,
    ) -> None:
        cache = self.caches.get(channel)
        if cache is None:
            return
        if payload in ("", None):  # a platform row: every organization's entry may hold it
            cache.clear()
            return
        try:
            cache.invalidate(UUID(str(payload)))
        except ValueError:
            cache.clear()
            self._malformed += 1
            now = self.clock()
            if now - self._malformed_logged_at >= MALFORMED_LOG_INTERVAL_S:
                log.warning(
                    "%s: %d malformed notification(s), the last %.64r; each dropped every entry",
                    channel,
                    self._malformed,
                    str(payload),
                )
                self._malformed, self._malformed_logged_at = 0, now

    def _on_termination(self, conn: object) -> None:
        log.warning("cache listener connection lost: caching is off until it reconnects")
        self._listening(False)
        self._conn = None
        if not self._stopped and (self._reconnect is None or self._reconnect.done()):
            self._reconnect = asyncio.get_running_loop().create_task(
                self._reconnect_until_listening()
            )
