"""The aiokafka adapter of the runtime's ports (consumers/runtime/transport.py): the group
member that fetches, publishing, committing and hearing about rebalances."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError, UnknownTopicOrPartitionError
from aiokafka.structs import ConsumerRecord

from broker.settings import KafkaSettings
from broker.topics import TopicSpec, ensure_topics, reach
from consumers.runtime.records import Inbound
from consumers.runtime.tracker import TopicPartition as Partition
from consumers.runtime.transport import PublishError, Rebalance
from schemas.errors import InfrastructureUnavailable

log = logging.getLogger("contextcore.consumer")


class KafkaTransport:
    """The runtime on Kafka (Apache Kafka in production, Tansu in development)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._kafka = kafka

    async def ensure_topics(self, specs: list[TopicSpec]) -> None:
        await ensure_topics(
            self._kafka.require_bootstrap_servers(),
            specs,
            timeout_s=self._kafka.connect_timeout_s,
            create=self._kafka.create_topics,
            replication_factor=self._kafka.topic_replication_factor,
        )

    def publisher(self, *, client_id: str) -> AiokafkaPublisher:
        return AiokafkaPublisher(self._kafka, client_id=client_id)

    def source(
        self,
        *,
        topic: str,
        group_id: str,
        client_id: str,
        fetch_max_wait_ms: int,
        rebalance: Rebalance,
    ) -> AiokafkaSource:
        return AiokafkaSource(
            self._kafka,
            topic=topic,
            group_id=group_id,
            client_id=client_id,
            fetch_max_wait_ms=fetch_max_wait_ms,
            listener=RebalanceListener(rebalance),
        )


def inbound_of(record: ConsumerRecord[bytes, bytes]) -> Inbound:
    headers = tuple((str(name), bytes(value or b"")) for name, value in record.headers or ())
    return Inbound(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=headers,
    )


class AiokafkaSource:
    """The group's member that fetches: subscribed with the rebalance listener, it fetches in
    batches and pauses. It never commits on its own (auto-commit off): the delivery commits
    through :class:`ConsumerCommitter`, after each record's outcome was published."""

    def __init__(
        self,
        kafka: KafkaSettings,
        *,
        topic: str,
        group_id: str,
        client_id: str,
        fetch_max_wait_ms: int,
        listener: ConsumerRebalanceListener,
    ) -> None:
        self._kafka = kafka
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.require_bootstrap_servers(),
            group_id=group_id,
            group_instance_id=kafka.group_instance_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=fetch_max_wait_ms,
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        )
        self.consumer.subscribe([topic], listener=listener)
        self.committer = ConsumerCommitter(self.consumer)

    async def start(self) -> None:
        """Connect and join the group: returns once this member holds its partitions. The join
        is not timed: it waits out a killed member's session timeout (the lifespan reached the
        broker moments before, through the publisher)."""
        try:
            await self.consumer.start()
        except (KafkaError, OSError) as error:
            await self.consumer.stop()
            raise InfrastructureUnavailable(
                f"cannot join the group at {self._kafka.require_bootstrap_servers()}: "
                f"{type(error).__name__}: {error}"
            ) from error

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Inbound] | None:
        """Up to ``max_records`` records of the assigned partitions, each partition's in order;
        none when nothing arrived within ``timeout_ms`` (or every partition is paused, or the
        broker did not answer: logged, then a pause); ``None`` once stopped."""
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except ConsumerStoppedError:
            return None
        except KafkaError as error:
            log.error("fetch failed: %s: %s", type(error).__name__, error)
            await asyncio.sleep(_FETCH_RETRY_S)
            return []
        return [inbound_of(record) for records in batches.values() for record in records]

    def pause(self) -> None:
        """Fetch nothing more from any partition this member holds."""
        self.consumer.pause(*self.consumer.assignment())

    async def stop(self) -> None:
        """Leave the group (the partitions go to another member)."""
        await self.consumer.stop()


class AiokafkaPublisher:
    """Publishes with ``acks=all`` and waits for the acknowledgement (no idempotent producer:
    Tansu refuses one, and every consumer is idempotent instead)."""

    def __init__(self, kafka: KafkaSettings, *, client_id: str) -> None:
        self._kafka = kafka
        self._producer = AIOKafkaProducer(
            bootstrap_servers=kafka.require_bootstrap_servers(),
            client_id=client_id,
            acks="all",
            enable_idempotence=False,
            linger_ms=0,
            request_timeout_ms=kafka.request_timeout_ms,
            max_request_size=kafka.max_request_bytes,
        )

    async def start(self) -> None:
        try:
            await reach(
                self._producer.start(),
                self._kafka.require_bootstrap_servers(),
                self._kafka.connect_timeout_s,
            )
        except InfrastructureUnavailable:
            await self._producer.stop()
            raise

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        try:
            await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
        except UnknownTopicOrPartitionError as error:
            # aiokafka calls it retriable; a topic that does not exist (a client that closed
            # and deleted its reply topic) will not appear because we wait: final.
            raise PublishError(f"topic {topic!r} does not exist", retriable=False) from error
        except KafkaError as error:
            raise PublishError(
                f"{type(error).__name__}: {error}", retriable=bool(error.retriable)
            ) from error
        except TimeoutError as error:
            raise PublishError("no acknowledgement in time", retriable=True) from error


class ConsumerCommitter:
    """Commits through the subscriber's own consumer (the group's member)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer

    async def commit(self, positions: Mapping[Partition, int]) -> None:
        await self._consumer.commit(
            {
                TopicPartition(topic, partition): offset
                for (topic, partition), offset in positions.items()
            }
        )

    def owns(self, partition: Partition) -> bool:
        return TopicPartition(*partition) in self._consumer.assignment()

    def high_watermark(self, partition: Partition) -> int | None:
        # highwater() reads what the last fetch response said; position() is avoided: for a
        # partition with no position it surfaces the group's pending errors, which belong to
        # the fetch loop
        tp = TopicPartition(*partition)
        if tp not in self._consumer.assignment():
            return None
        high: int | None = self._consumer.highwater(tp)
        return high


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka's listener, told to the runtime's :class:`Rebalance`."""

    def __init__(self, rebalance: Rebalance) -> None:
        self._rebalance = rebalance

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if revoked:
            await self._rebalance.revoked([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._rebalance.assigned([(tp.topic, tp.partition) for tp in assigned])


_FETCH_RETRY_S = 1.0
"""The pause after a fetch the broker did not answer."""
