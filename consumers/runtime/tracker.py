"""Which offsets of each partition are in flight, and how far a commit may go. Pure.

Records of one partition finish out of order when many are in flight. The commit position of a
partition is one past the highest offset below which every started record has finished: a
commit never passes an unfinished record, so a crash redelivers it (and perhaps some finished
ones after it: at least once).

A :class:`PartitionTracker` lives for one assignment of its partition. When the partition is
revoked the runtime drops it; a record that finishes later reports to the dropped tracker, which
no longer commits anything.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class PartitionTracker:
    started_at: dict[int, float] = field(default_factory=dict)
    """In-flight (and finished but not yet committable) offsets, with their start times."""
    _pending: list[int] = field(default_factory=list)  # heap of offsets not yet committable
    _finished: set[int] = field(default_factory=set)
    position: int | None = None
    """The next offset to read after a restart: what a commit would store."""
    revoked: bool = False

    def start(self, offset: int, now: float) -> bool:
        """Track ``offset``; ``False`` when it is already tracked (a duplicate delivery)."""
        if offset in self.started_at or (self.position is not None and offset < self.position):
            return False
        self.started_at[offset] = now
        heapq.heappush(self._pending, offset)
        return True

    def finish(self, offset: int) -> int | None:
        """Mark ``offset`` finished; the new commit position when it moved, else ``None``."""
        if offset not in self.started_at or offset in self._finished:
            return None
        self._finished.add(offset)
        moved = False
        while self._pending and self._pending[0] in self._finished:
            done = heapq.heappop(self._pending)
            self._finished.discard(done)
            del self.started_at[done]
            self.position = done + 1
            moved = True
        return self.position if moved and not self.revoked else None

    @property
    def in_flight(self) -> int:
        """Records started and not finished."""
        return len(self.started_at) - len(self._finished)

    def resume_at(self, received_up_to: int | None) -> int | None:
        """Where a restart would read from: the lowest record not yet committable, else the
        commit position, else (nothing finished in this assignment) one past the highest
        offset received, which nothing holds back."""
        if self._pending:
            return self._pending[0]
        return self.position if self.position is not None else received_up_to

    def oldest_start(self) -> float | None:
        """When the lowest unfinished record started: it holds the commit position back."""
        if not self._pending:
            return None
        return self.started_at[self._pending[0]]


TopicPartition = tuple[str, int]


@dataclass
class InFlight:
    """The trackers of the partitions this process owns right now."""

    trackers: dict[TopicPartition, PartitionTracker] = field(default_factory=dict)

    def assign(self, partitions: list[TopicPartition]) -> None:
        for partition in partitions:
            if partition not in self.trackers:
                self.trackers[partition] = PartitionTracker()

    def revoke(self, partitions: list[TopicPartition]) -> dict[TopicPartition, PartitionTracker]:
        """Drop the trackers of ``partitions`` and return them (their last positions)."""
        dropped: dict[TopicPartition, PartitionTracker] = {}
        for partition in partitions:
            tracker = self.trackers.pop(partition, None)
            if tracker is not None:
                tracker.revoked = True
                dropped[partition] = tracker
        return dropped

    def tracker(self, partition: TopicPartition) -> PartitionTracker | None:
        return self.trackers.get(partition)

    def oldest_ages(self, now: float) -> dict[TopicPartition, float]:
        """Per partition, the age of the record that holds its commit position back."""
        ages: dict[TopicPartition, float] = {}
        for partition, tracker in list(self.trackers.items()):
            started = tracker.oldest_start()
            ages[partition] = 0.0 if started is None else max(now - started, 0.0)
        return ages
