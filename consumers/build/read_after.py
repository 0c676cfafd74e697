"""Read-your-writes: which database a request's sources read (docs/scaling.md).

A request without ``read_after`` reads the read database (a replica when one is configured).
A request naming a position reads a database that has that write:

    no replica                    -> the primary, as every request
    the replica has replayed it   -> the replica
    it has not (or cannot say)    -> the primary

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
    """Whether a replica has replayed a position (``contextcore.storage.positions``)."""

    async def reached(self, position: str) -> bool: ...


@dataclass(frozen=True)
class Readers:
    """The builders of one process: ``read`` on the read database; ``primary`` on the primary
    when the read database is a replica (``None`` when it is the primary), chosen by
    ``replay`` for a request that names a position."""

    read: ContextBuilder
    metrics: BuildMetrics
    primary: ContextBuilder | None = None
    replay: Replay | None = None

    async def builder(self, read_after: str | None) -> ContextBuilder:
        if read_after is None:
            return self.read
        if self.primary is None:
            self.metrics.read_after.labels("primary").inc()
            return self.read
        assert self.replay is not None
        if await self.replay.reached(read_after):
            self.metrics.read_after.labels("replica").inc()
            return self.read
        self.metrics.read_after.labels("primary").inc()
        return self.primary
