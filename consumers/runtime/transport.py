"""The runtime's ports to a broker: what :class:`~consumers.runtime.app.ConsumerApp` needs of one,
so the same app runs on Kafka (consumers/runtime/kafka.py) or in memory
(consumers/runtime/inmemory.py).

A :class:`Transport` makes the topics, a publisher and the group member that fetches (the
:class:`RecordSource`). The member tells a :class:`Rebalance` which partitions it gained or is
about to lose, and commits through its :class:`~consumers.runtime.delivery.Committer`; it never
commits on its own.
"""

from __future__ import annotations

from typing import Protocol

from broker.topics import TopicSpec
from consumers.runtime.delivery import Committer, Publisher
from consumers.runtime.records import Inbound
from consumers.runtime.tracker import TopicPartition


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
