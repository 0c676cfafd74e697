"""Tiny fakes of the delivery's ports (publisher, committer, handler, start journal) and a
:class:`Rig` that runs a :class:`~consumers.runtime.delivery.Delivery` on them: what the tests of
the delivery's modules (tests/unit/test_delivery.py, test_window.py, test_pipeline.py,
test_replies.py, test_retries.py, test_commits.py, test_monitor.py) share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from broker.lanes import HEADER_ORGANIZATION
from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from consumers.runtime.delivery import Delivery
from consumers.runtime.inmemory import MemoryBroker, MemoryPublisher, MemorySource, MemoryTransport
from consumers.runtime.journal import Prior
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    Inbound,
    Outcome,
    Position,
    Reply,
    Stopwatch,
)
from consumers.runtime.replies import Replies
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.transport import PublishError
from schemas.envelope import DeadLetterV1


class Message(BaseModel):
    text: str


@dataclass
class Sent:
    topic: str
    value: bytes
    key: bytes | None
    headers: dict[str, bytes]


@dataclass
class FakePublisher:
    failures: dict[str, list[PublishError]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    async def publish(
        self, topic: str, value: bytes, *, key: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        await asyncio.sleep(0)
        queued = self.failures.get(topic)
        if queued:
            raise queued.pop(0)
        self.sent.append(Sent(topic, value, key, dict(headers)))

    def to(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]


@dataclass
class FakeCommitter:
    commits: list[dict[tuple[str, int], int]] = field(default_factory=list)

    async def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.commits.append(dict(positions))

    owned: set[tuple[str, int]] = field(default_factory=set)

    def owns(self, partition: tuple[str, int]) -> bool:
        return partition in self.owned

    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)

    def high_watermark(self, partition: tuple[str, int]) -> int | None:
        return self.watermarks.get(partition)

    def last(self, partition: tuple[str, int] = ("t", 0)) -> int | None:
        found = [c[partition] for c in self.commits if partition in c]
        return found[-1] if found else None


class Scripted:
    """A handler whose outcome per offset is scripted; it can wait on a gate per offset."""

    def __init__(self, outcome: Callable[[Inbound], Outcome]) -> None:
        self.outcome = outcome
        self.gates: dict[int, asyncio.Event] = {}
        self.seen: list[int] = []
        self.farewells: list[tuple[int, str]] = []

    def hold(self, *offsets: int) -> None:
        for offset in offsets:
            self.gates[offset] = asyncio.Event()

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        self.seen.append(record.offset)
        if record.offset in self.gates:
            await self.gates[record.offset].wait()
        return self.outcome(record)

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        self.farewells.append((record.offset, reason))
        return Reply("replies", f"farewell-{record.offset}", Message(text=reason))


class Screening(Scripted):
    """:class:`Scripted`, with a screen that answers the records whose value is ``"no"``."""

    def __init__(self, outcome: Callable[[Inbound], Outcome]) -> None:
        super().__init__(outcome)
        self.screened: list[int] = []

    async def screen(self, record: Inbound) -> Reply | None:
        if record.value != b'"no"':
            return None
        self.screened.append(record.offset)
        return Reply("replies", f"no-{record.offset}", Message(text="throttled"))


def reply(record: Inbound) -> Outcome:
    return Reply("replies", f"c-{record.offset}", Message(text=f"answer {record.offset}"))


def settings(**changes: Any) -> ConsumerSettings:
    values: dict[str, Any] = {
        "group_id": "g",
        "metrics_port": 0,
        "max_in_flight": 8,
        "handle_timeout_s": 5.0,
        "stuck_after_s": 10.0,
        "drain_timeout_s": 2.0,
        "max_attempts": 3,
        "retry_backoff_s": 0.01,
        "retry_backoff_max_s": 0.05,
        "dead_letter_payload_bytes": 256,
        "commit_interval_s": 0.0,
    }
    return ConsumerSettings.model_construct(**{**values, **changes})


def record(
    offset: int, value: bytes = b"{}", partition: int = 0, headers: dict[str, bytes] | None = None
) -> Inbound:
    return Inbound("t", partition, offset, b"k", value, tuple((headers or {}).items()))


def of(organization: str) -> dict[str, bytes]:
    return {HEADER_ORGANIZATION: organization.encode()}


@dataclass
class FakeJournal:
    """The start journal's port: what each position's earlier starts left, and every call."""

    prior: dict[int, Prior] = field(default_factory=dict)
    calls: list[tuple[str, object]] = field(default_factory=list)

    async def started(self, position: Position) -> Prior:
        self.calls.append(("started", position.offset))
        return self.prior.get(position.offset, Prior())

    async def solo_started(self, position: Position) -> None:
        self.calls.append(("solo_started", position.offset))

    async def solo_finished(self, position: Position) -> None:
        self.calls.append(("solo_finished", position.offset))

    async def forget(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.calls.append(("forget", dict(positions)))


REPLY_TOPICS = ReplyTopics.of(
    TopicSettings.model_construct(reply_prefix="replies", reply_pattern=r"replies(\..+)?")
)
"""The rule of these tests: ``replies`` and the names under it."""


class Rig:
    """A :class:`Delivery` on the fakes above, partitions ``t[0]`` and ``t[1]`` assigned;
    ``clock``, ``wall_ms``, ``sleep`` and ``reply_topics`` replace the delivery's."""

    def __init__(
        self,
        handler: Scripted,
        journal: FakeJournal | None = None,
        *,
        reply_topics: ReplyTopics = REPLY_TOPICS,
        **changes: Any,
    ) -> None:
        clocks = {k: changes.pop(k) for k in ("clock", "wall_ms", "sleep") if k in changes}
        self.publisher = FakePublisher()
        self.committer = FakeCommitter()
        self.handler = handler
        self.journal = journal or FakeJournal()
        self.delivery = Delivery(
            consumer="test",
            handler=handler,
            publisher=self.publisher,
            settings=settings(**changes),
            max_record_bytes=4_096,
            metrics=RuntimeMetrics.create(),
            reply_topics=reply_topics,
            journal=self.journal,
            **clocks,
        )
        self.delivery.assign([("t", 0), ("t", 1)])
        self.delivery.start(self.committer)

    async def settle(self) -> None:
        """Let every started record finish and the committer run."""
        for _ in range(50):
            await asyncio.sleep(0)
        while tasks := [t for ts in self.delivery.window.tasks.values() for t in ts]:
            await asyncio.gather(*tasks)
        for _ in range(20):
            await asyncio.sleep(0)

    async def close(self) -> None:
        await self.delivery.close()


def letter_of(sent: Sent | Inbound) -> DeadLetterV1:
    return DeadLetterV1.model_validate_json(sent.value or b"")


# ------------------------------------------------------------- on the in-memory transport


class NoRebalance:
    def assigned(self, partitions: list[tuple[str, int]]) -> None:
        pass

    async def revoked(self, partitions: list[tuple[str, int]]) -> None:
        pass


async def member(broker: MemoryBroker, *, topic: str = "t", partitions: int = 2) -> MemorySource:
    """The one member of group ``g`` on ``broker``, holding ``topic``'s partitions."""
    broker.create_topic(topic, partitions)
    source = MemoryTransport(broker).source(
        topic=topic, group_id="g", client_id="test", fetch_max_wait_ms=0, rebalance=NoRebalance()
    )
    await source.start()
    return source


def replies_on(broker: MemoryBroker, reply_topics: ReplyTopics = REPLY_TOPICS) -> Replies:
    """A :class:`Replies` publishing to ``broker`` (records of at most 4,096 bytes)."""
    return Replies(
        consumer="test",
        publisher=MemoryPublisher(broker),
        metrics=RuntimeMetrics.create(),
        reply_topics=reply_topics,
        max_record_bytes=4_096,
    )
