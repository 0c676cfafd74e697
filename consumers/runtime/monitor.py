"""What the delivery says of itself, from snapshots: liveness (``/healthz``), each partition's
oldest record in flight and its lag (``/metrics``).

The event loop refreshes a snapshot every second; the health server's thread and the scrape
read only the snapshot, never the live structures. A snapshot that stopped being refreshed is a
stalled loop (not live); so is a partition whose oldest record in flight is older than
``stuck_after_s`` (a restart redelivers what held it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from consumers.runtime.health import Health
from consumers.runtime.records import Inbound
from consumers.runtime.tracker import InFlight, TopicPartition
from consumers.runtime.transport import Committer

INTERVAL_S = 1.0
"""How often the snapshot is refreshed."""
STALLED_AFTER_S = max(10.0, 5 * INTERVAL_S)
"""A snapshot this old means the event loop stopped running."""


@dataclass(frozen=True)
class Snapshot:
    taken_at: float = 0.0
    ages: dict[TopicPartition, float] = field(default_factory=dict)
    lags: dict[TopicPartition, int] = field(default_factory=dict)


class Monitor:
    def __init__(
        self,
        *,
        consumer: str,
        in_flight: InFlight,
        stuck_after_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.consumer = consumer
        self.in_flight = in_flight
        self.stuck_after_s = stuck_after_s
        self.clock = clock
        self.snapshot = Snapshot()
        self._committer: Committer | None = None
        self._fetched: dict[TopicPartition, int] = {}  # one past the highest offset received

    def start(self, committer: Committer) -> asyncio.Task[None]:
        """Judge the member of ``committer`` from now on: the task that refreshes the snapshot."""
        self._committer = committer
        self.refresh()
        return asyncio.create_task(self._loop(), name=f"{self.consumer}-monitor")

    def received(self, records: Iterable[Inbound]) -> None:
        """Note fetched records before they wait for slots: the lag counts them."""
        for record in records:
            partition = (record.topic, record.partition)
            if record.offset >= self._fetched.get(partition, -1):
                self._fetched[partition] = record.offset + 1

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """``partitions`` are no longer ours: what was received of them says nothing more."""
        for partition in partitions:
            self._fetched.pop(partition, None)

    def health(self) -> Health:
        """Live unless the loop stalled or a partition's oldest record is older than allowed."""
        if self._committer is None:
            return Health(True, "starting")
        snapshot = self.snapshot
        stale = self.clock() - snapshot.taken_at
        if stale > STALLED_AFTER_S:
            return Health(False, f"the event loop has not run for {stale:.0f} s")
        for (topic, partition), age in sorted(snapshot.ages.items()):
            if age > self.stuck_after_s:
                return Health(False, f"{topic}[{partition}] has not moved for {age:.0f} s")
        return Health(True, "ok")

    def oldest_ages(self) -> dict[TopicPartition, float]:
        """The last snapshot of per-partition ages (safe to read from another thread)."""
        return dict(self.snapshot.ages)

    def lags(self) -> dict[TopicPartition, int]:
        """The last snapshot of per-partition lag: records between where a restart would
        resume and the high watermark (safe to read from another thread)."""
        return dict(self.snapshot.lags)

    def refresh(self) -> None:
        now = self.clock()
        self.snapshot = Snapshot(now, self.in_flight.oldest_ages(now), self.current_lags())

    def current_lags(self) -> dict[TopicPartition, int]:
        """Per owned partition: the high watermark minus where a restart would resume. Left
        out until the member has received a record of the partition in this assignment (the
        resume point is unknown before) or a fetch reported its watermark."""
        lags: dict[TopicPartition, int] = {}
        if self._committer is None:
            return lags
        for partition, tracker in list(self.in_flight.trackers.items()):
            high = self._committer.high_watermark(partition)
            resume = tracker.resume_at(self._fetched.get(partition))
            if high is not None and resume is not None:
                lags[partition] = max(high - resume, 0)
        return lags

    async def _loop(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(INTERVAL_S)
