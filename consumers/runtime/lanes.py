"""The records a consumer received and has not started yet, one lane per organization, taken
round robin: a tenant behind another's flood in the same partition starts within one turn of
each other tenant with records waiting, not after the whole flood (issue 33; docs/delivery.md,
"Fair shares inside a consumer"). Pure.

A record's lane is its ``contextcore-organization`` header (:mod:`broker.lanes`), which the
clients and the upload consumer set; a record without it, or with a value longer than a UUID's
text, rides the shared lane ``""``. The header decides an order, nothing else: the handler
reads the organization from the value, so a forged header can move a record in the queue,
never into another tenant's rows. Inside a lane the order is the order received. The count
and the bytes held are the caller's to bound (:class:`~consumers.runtime.window.Window`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Iterable

from broker.lanes import HEADER_ORGANIZATION
from consumers.runtime.records import Inbound
from consumers.runtime.tracker import TopicPartition

MAX_LANE_BYTES = 64
"""A lane name longer than this is not an organization id: the record rides the shared lane."""


def lane_of(record: Inbound) -> str:
    """The record's lane: its organization header, else the shared lane ``""``."""
    for key, value in record.headers:
        if key == HEADER_ORGANIZATION:
            if len(value) > MAX_LANE_BYTES:
                return ""
            return value.decode("ascii", "replace")
    return ""


class Lanes:
    """Waiting records by lane; :meth:`take` serves the lanes in turn."""

    def __init__(self) -> None:
        self._lanes: OrderedDict[str, deque[Inbound]] = OrderedDict()
        self.count = 0
        self.bytes = 0

    def put(self, record: Inbound) -> None:
        lane = lane_of(record)
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()  # a new lane waits behind the others' turns
        queue.append(record)
        self.count += 1
        self.bytes += _size(record)

    def take(self) -> Inbound | None:
        """The head of the next lane in turn; that lane goes to the back while it has more."""
        if not self._lanes:
            return None
        return self._pop(next(iter(self._lanes)))

    def take_quiet(self, busy: Container[str]) -> Inbound | None:
        """The head of the next lane in turn that is not ``busy`` (a lane with a record
        running), or ``None``. Looks past at most as many lanes as are busy."""
        for lane in self._lanes:
            if lane not in busy:
                return self._pop(lane)
        return None

    def _pop(self, lane: str) -> Inbound:
        queue = self._lanes[lane]
        record = queue.popleft()
        if queue:
            self._lanes.move_to_end(lane)
        else:
            del self._lanes[lane]
        self.count -= 1
        self.bytes -= _size(record)
        return record

    def drop(self, partitions: Iterable[TopicPartition] | None = None) -> int:
        """Forget the waiting records of ``partitions`` (all with ``None``); how many."""
        wanted = None if partitions is None else set(partitions)
        dropped = 0
        for lane, queue in list(self._lanes.items()):
            kept: deque[Inbound] = deque()
            for record in queue:
                if wanted is None or (record.topic, record.partition) in wanted:
                    dropped += 1
                    self.bytes -= _size(record)
                else:
                    kept.append(record)
            if kept:
                self._lanes[lane] = kept
            else:
                del self._lanes[lane]
        self.count -= dropped
        return dropped

    def __len__(self) -> int:
        return self.count

    def lanes(self) -> int:
        return len(self._lanes)


def _size(record: Inbound) -> int:
    return len(record.value or b"") + len(record.key or b"")
