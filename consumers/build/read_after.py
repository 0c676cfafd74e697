"""Read-your-writes: which database a request's sources read (docs/scaling.md).

A request without ``read_after`` reads the read database (a replica when one is configured).
A request naming a position reads a database that has that write:

    no replica                           -> the primary, as every request
    the replica has replayed it          -> the replica
    it has not (or cannot say)           -> the primary
    the primary never wrote it           -> the replica, as if no position were named

The caches (dossier, definitions, live models) stay in front of both: the writes answered
with a position (memory, a document's ``ready``) are never cached, and what is cached is
invalidated when the primary commits (docs/scaling.md says what that leaves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from consumers.build.metrics import BuildMetrics
from contextcore.builder import ContextBuilder


class Replay(Protocol):
    """Whether the replica has replayed a position (``contextcore.storage.positions``)."""

    async def reached(self, position: str) -> bool: ...


class Written(Protocol):
    """Whether the primary has written a position (``contextcore.storage.positions``)."""

    async def wrote(self, position: str) -> bool: ...


@dataclass(frozen=True)
class Primary:
    """What a process whose sources read a replica keeps of its primary: a builder on it, and
    the two questions that decide when to use it."""

    builder: ContextBuilder
    replay: Replay
    written: Written


@dataclass(frozen=True)
class Readers:
    """The builders of one process: ``read`` on the read database, and ``primary`` when the
    read database is a replica (``None`` when it is the primary itself)."""

    read: ContextBuilder
    metrics: BuildMetrics
    primary: Primary | None = None

    async def builder(self, read_after: str | None) -> ContextBuilder:
        if read_after is None:
            return self.read
        served, builder = await self._choose(read_after)
        self.metrics.read_after.labels(served).inc()
        return builder

    async def _choose(self, read_after: str) -> tuple[str, ContextBuilder]:
        if self.primary is None:
            return "primary", self.read
        if not await self.primary.written.wrote(read_after):
            return "ignored", self.read
        if await self.primary.replay.reached(read_after):
            return "replica", self.read
        return "primary", self.primary.builder
