"""The runtime's ports: what the delivery (consumers/runtime/delivery.py) and
:class:`~consumers.runtime.app.ConsumerApp` need of a broker and of a handler, so the same app
runs on Kafka (consumers/runtime/kafka.py) or in memory (consumers/runtime/inmemory.py). This
module declares; it imports no implementation.

A :class:`Transport` makes the topics, a :class:`Publisher` and the group member that fetches
(the :class:`RecordSource`). The member tells a :class:`Rebalance` which partitions it gained or
is about to lose, and commits through its :class:`Committer`; it never commits on its own. A
:class:`RecordHandler` turns a record into its outcome; it may :data:`Screen` records on their
receipt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from broker.topics import TopicSpec
from consumers.runtime.records import Inbound, Outcome, Reply, Stopwatch
from consumers.runtime.tracker import TopicPartition
from schemas.errors import ContextcoreError


class PublishError(ContextcoreError):
    """The broker did not take a record. ``retriable``: it may take it later."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        self.retriable = retriable
        super().__init__(message)


class Publisher(Protocol):
    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        """Publish and wait for the broker's acknowledgement, or raise :class:`PublishError`."""


class Committer(Protocol):
    async def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        """Commit each partition's next offset to read."""

    def owns(self, partition: TopicPartition) -> bool:
        """Whether the group assigned ``partition`` to this member right now."""

    def high_watermark(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as this member's last fetch saw it; ``None`` while
        unknown or not assigned. No request, no side effect."""


class RecordHandler(Protocol):
    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        """One record's outcome. Raising is allowed (it becomes a retry)."""

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """The error reply for a record the runtime gave up on (``reason`` says why), when its
        reply address can still be read; ``None`` when there is nobody to tell."""


Screen = Callable[[Inbound], Awaitable[Reply | None]]
"""A handler's optional ``screen(record)``: a cheap look at a record on its receipt, before it
waits for a slot; a :class:`Reply` answers it there (the build consumer's ``throttled``), with
no slot, no journal start and no handling; ``None`` lets it wait for a slot as any record."""


class Rebalance(Protocol):
    def assigned(self, partitions: list[TopicPartition]) -> None:
        """This member now holds ``partitions``."""

    async def revoked(self, partitions: list[TopicPartition]) -> None:
        """This member is about to lose ``partitions``: returns once their records drained and
        their position committed."""


class RecordSource(Protocol):
    @property
    def committer(self) -> Committer:
        """Commits positions as this member of the group."""

    async def start(self) -> None:
        """Join the group: returns once this member holds its partitions, or raises
        :class:`~schemas.errors.InfrastructureUnavailable`."""

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Inbound] | None:
        """Up to ``max_records`` records of the held partitions, each partition's in order; none
        when nothing arrived within ``timeout_ms``, every partition is paused, or the broker did
        not answer (the source says so in its log and waits a moment); ``None`` once stopped."""

    def pause(self) -> None:
        """Fetch nothing more from any partition this member holds."""

    async def stop(self) -> None:
        """Leave the group (the partitions go to another member)."""


class StartedPublisher(Publisher, Protocol):
    async def start(self) -> None:
        """Reach the broker, or raise :class:`~schemas.errors.InfrastructureUnavailable`."""

    async def stop(self) -> None: ...


class Transport(Protocol):
    async def ensure_topics(self, specs: list[TopicSpec]) -> None:
        """Make sure ``specs`` exist (create them when this transport may), or raise."""

    def publisher(self, *, client_id: str) -> StartedPublisher: ...

    def source(
        self,
        *,
        topic: str,
        group_id: str,
        client_id: str,
        fetch_max_wait_ms: int,
        rebalance: Rebalance,
    ) -> RecordSource: ...
