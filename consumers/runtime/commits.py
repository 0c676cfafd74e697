"""Commit positions: a partition's offset moves past every finished record below its lowest
unfinished one (:class:`~consumers.runtime.tracker.PartitionTracker`), and a background task
commits it (docs/delivery.md, step 7).

A record is finished once its outcome was published, so nothing is committed before its effect
(at least once). Commits coalesce: a burst of finished records is one commit request, and
``commit_interval_s`` spaces them. A failed commit keeps the positions of the partitions still
ours for the next try; the member that takes a partition over reads again from the last one
committed. What is committed is forgotten by the start journal: it is not delivered again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from consumers.runtime.journal import StartJournal
from consumers.runtime.metrics import RuntimeMetrics, Stages
from consumers.runtime.records import Inbound, describe
from consumers.runtime.tracker import InFlight, PartitionTracker, TopicPartition
from consumers.runtime.transport import Committer

log = logging.getLogger("contextcore.delivery")

_RETRY_FAILED_S = 0.5
"""A failed commit is tried again with the next ones, this long after."""


class Commits:
    def __init__(
        self,
        *,
        consumer: str,
        in_flight: InFlight,
        journal: StartJournal,
        metrics: RuntimeMetrics,
        stages: Stages,
        interval_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.consumer = consumer
        self.in_flight = in_flight
        self.journal = journal
        self.interval_s = interval_s
        self.clock = clock
        self.committer: Committer | None = None
        """The group member's, once it joined (:meth:`start`): nothing is committed before."""
        self._stages = stages
        self._ok = metrics.commits.labels(consumer, "ok")
        self._failed = metrics.commits.labels(consumer, "failed")
        self._positions: dict[TopicPartition, int] = {}  # finished, not yet committed
        self._wanted = asyncio.Event()
        self._lock = asyncio.Lock()

    def start(self, committer: Committer) -> asyncio.Task[None]:
        """Commit through ``committer`` from now on: the background task that does."""
        self.committer = committer
        if self._positions:  # records that finished before the consumer was ready
            self._wanted.set()
        return asyncio.create_task(self._loop(), name=f"{self.consumer}-commits")

    def owns(self, partition: TopicPartition) -> bool:
        """Whether the group assigned ``partition`` to this member (never before it joined)."""
        return self.committer is not None and self.committer.owns(partition)

    def finished(self, record: Inbound, tracker: PartitionTracker) -> None:
        """``record``'s outcome is out: its partition's position may move past it."""
        position = tracker.finish(record.offset)
        if position is not None:
            self._positions[(record.topic, record.partition)] = position
            self._wanted.set()

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Drop the pending positions of ``partitions`` (revoked: their final one is given to
        :meth:`commit` by the revoke itself)."""
        for partition in partitions:
            self._positions.pop(partition, None)

    async def flush(self) -> bool:
        """Commit every pending position now: whether it was committed (or none pended)."""
        if not self._positions:
            return True
        batch, self._positions = self._positions, {}
        if await self.commit(batch):
            return True
        for partition, position in batch.items():  # keep what is still ours for the next try
            if self.in_flight.tracker(partition) is not None:
                self._positions.setdefault(partition, position)
        return False

    async def commit(self, positions: Mapping[TopicPartition, int]) -> bool:
        """Commit ``positions``, one request at a time, then forget them in the journal."""
        if self.committer is None:
            return False
        started = self.clock()
        async with self._lock:
            try:
                await self.committer.commit(positions)
            except Exception as error:
                self._failed.inc()
                log.warning("%s: commit failed: %s", self.consumer, describe(error))
                return False
        self._ok.inc()
        self._stages("commit").observe(self.clock() - started)
        await self.journal.forget(positions)  # what is committed is not delivered again
        return True

    async def _loop(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            if not await self.flush():
                await asyncio.sleep(_RETRY_FAILED_S)
                self._wanted.set()
            elif self.interval_s:
                await asyncio.sleep(self.interval_s)  # coalesce what follows
