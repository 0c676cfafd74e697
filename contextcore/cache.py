"""Per-organization caches of slowly changing source data, invalidated across processes.

A write to a cached table fires ``pg_notify(<channel>, <organization id>)`` (the dossier's
tables: migration 00003; definitions: 00030), or an empty payload when a platform row changed
(every organization's entry may hold it). The database's side,
:class:`~contextcore.storage.invalidation.CacheInvalidator`, LISTENs on a dedicated connection in
every process and drops the entries named, so a write made by any process, or by hand in
``psql``, is seen by the next build everywhere, not only by the writer. The cache itself is pure
logic: the knowledge search's live models and the sources' rows share it.

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

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar
from uuid import UUID

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
