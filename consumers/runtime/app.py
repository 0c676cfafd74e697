"""A FastStream application for one consumer: one subscriber, its records fed to a
:class:`~consumers.runtime.delivery.Delivery`.

FastStream runs the group membership, the fetch loop and the process lifecycle
(``faststream run consumers.build.app:app`` works, as does ``contextcore serve build``). The
AsyncAPI document comes from the same declarations (:attr:`ConsumerApp.declaration`,
consumers/runtime/asyncapi.py, ``docs/asyncapi/``), not from FastStream: its handler takes raw
records, so the payload it reads is declared, never inferred from a type hint. The subscriber
uses ``AckPolicy.MANUAL``: FastStream never commits or seeks; the delivery commits each
partition's position itself, after the outcome was published.

Start-up (the lifespan) fails closed before the first record is fetched: the broker must
answer, the topics exist, and ``open_handler`` has checked the schema and opened what the
handler needs. Shutdown drains in-flight records and commits before the group is left.

Every consumer counts the records it starts in the database's start journal
(:mod:`consumers.runtime.journal`), through a pool of its own, and probes the database every
``_PROBE_INTERVAL_S``: ``/readyz`` says not ready while it does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from aiokafka.structs import ConsumerRecord
from faststream import FastStream
from faststream.kafka import KafkaBroker, KafkaMessage
from faststream.kafka.message import FAKE_CONSUMER
from faststream.middlewares import AckPolicy
from pydantic import BaseModel

from broker.settings import KafkaSettings
from broker.topics import TopicSpec, ensure_topics
from consumers.runtime.asyncapi import Channel, Declaration
from consumers.runtime.decoding import DEAD_LETTER_CAUSES
from consumers.runtime.delivery import Delivery, Health, Publisher, RecordHandler
from consumers.runtime.health import HealthServer
from consumers.runtime.journal import PostgresJournal
from consumers.runtime.kafka import (
    AiokafkaPublisher,
    ConsumerCommitter,
    RebalanceListener,
    inbound_of,
)
from consumers.runtime.metrics import RuntimeMetrics, consumer_lag, oldest_in_flight
from consumers.runtime.settings import ConsumerSettings
from contextcore.settings import DatabaseSettings
from contextcore.storage.pool import create_pool
from schemas.errors import ConfigurationError

log = logging.getLogger("contextcore.consumer")


async def _tolerant_parser(records: tuple[ConsumerRecord[bytes, bytes], ...]) -> KafkaMessage:
    """FastStream's message for one fetched batch of records, without decoding a header value
    FastStream would choke on.

    The subscriber takes records in batches: FastStream's own per-message dispatch cost as much
    CPU as the memory consumer's handling (docs/performance.md). The default parser also runs
    ``value.decode()`` on every header: a header holding invalid UTF-8 or no value raises there,
    before our entry point, and FastStream skips the batch, which a later commit would then
    pass. Header values are only for FastStream's log context here: the first record's.
    """
    first = records[0]
    headers = {
        name: value.decode("utf-8", "replace") if isinstance(value, bytes) else ""
        for name, value in first.headers or ()
    }
    return KafkaMessage(
        body=b"",
        headers=headers,
        reply_to="",
        content_type=headers.get("content-type"),
        message_id=f"{first.offset}-{records[-1].offset}-{first.timestamp}",
        correlation_id=headers.get("correlation_id"),
        raw_message=records,
        consumer=FAKE_CONSUMER,  # AckPolicy.MANUAL: FastStream never acks through it
    )


async def _raw_records(message: KafkaMessage) -> Any:
    """Hand the entry point the aiokafka records themselves: decoding, and its failures, are
    the handler's. (Taking the records as the body, not as an injected ``KafkaMessage``
    parameter, spares FastStream a context lookup that it runs in a worker thread.)"""
    return message.raw_message


class ConsumerApp:
    def __init__(
        self,
        *,
        name: str,
        topic: str,
        description: str,
        payload: type[BaseModel],
        publishes: Sequence[Channel],
        settings: ConsumerSettings,
        kafka: KafkaSettings,
        database: DatabaseSettings,
        topics: list[TopicSpec],
        open_handler: Callable[
            [RuntimeMetrics, Publisher], AbstractAsyncContextManager[RecordHandler]
        ],
        version: str = "1",
        dead_letter_causes: Sequence[str] = (),
        retry_causes: Sequence[str] = (),
    ) -> None:
        """``dead_letter_causes`` and ``retry_causes``: the handler's own, beside the
        runtime's and the decoder's; their series start at 0."""
        longest = settings.longest_healthy_record_s(kafka.request_timeout_ms / 1000)
        if settings.stuck_after_s <= longest:
            raise ConfigurationError(
                f"stuck_after_s ({settings.stuck_after_s:g} s) must exceed the longest a healthy "
                f"record may take ({longest:g} s: back-off, handling, two publishes)"
            )
        self.name = name
        self.topic = topic
        self.settings = settings
        self.kafka = kafka
        self.database = database
        self.topics = topics
        self.open_handler = open_handler
        self.metrics = RuntimeMetrics.create()
        self.dead_letter_causes = (*DEAD_LETTER_CAUSES, *dead_letter_causes)
        self.retry_causes = tuple(retry_causes)
        self.delivery: Delivery | None = None
        self.journal: PostgresJournal | None = None
        self._health: HealthServer | None = None
        self._ready = False
        self.broker = KafkaBroker(
            kafka.bootstrap_servers or "localhost:9092",
            client_id=f"contextcore-{name}",
            enable_idempotence=False,  # Tansu refuses idempotent producers; consumers dedupe
            logger=log,
        )
        self.subscriber = self.broker.subscriber(
            topic,
            group_id=settings.group_id,
            group_instance_id=kafka.group_instance_id,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=(
                kafka.fetch_max_wait_ms
                if settings.fetch_max_wait_ms is None
                else settings.fetch_max_wait_ms
            ),
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=kafka.heartbeat_interval_ms,
            ack_policy=AckPolicy.MANUAL,
            no_reply=True,
            listener=RebalanceListener(lambda: self.delivery),
            batch=True,
            max_records=settings.max_in_flight,
            parser=_tolerant_parser,
            decoder=_raw_records,
        )

        async def entry(records: Any) -> None:
            delivery = self.delivery
            if delivery is None:  # not reachable while the app runs: the lifespan sets it first
                log.error("%s: records arrived before the delivery was ready", name)
                return
            inbound = [inbound_of(record) for record in records]
            delivery.received(inbound)  # the lag counts records still waiting for a slot
            for record in inbound:
                await delivery.submit(record)

        entry.__name__ = f"{name}_records"
        self.subscriber(entry)
        self.declaration = Declaration(name, version, description, topic, payload, publishes)
        """What the AsyncAPI document is made from (consumers/runtime/asyncapi.py)."""
        self.app = FastStream(
            self.broker,
            lifespan=self._lifespan,
            after_startup=[self._started],
            on_shutdown=[self._drain],
        )

    @asynccontextmanager
    async def _lifespan(self, **_: Any) -> AsyncIterator[None]:
        bootstrap = self.kafka.require_bootstrap_servers()
        await ensure_topics(
            bootstrap,
            self.topics,
            timeout_s=self.kafka.connect_timeout_s,
            create=self.kafka.create_topics,
            replication_factor=self.kafka.topic_replication_factor,
        )
        publisher = AiokafkaPublisher(self.kafka, client_id=f"contextcore-{self.name}")
        await publisher.start()
        # serving before the handler opens: loading a model takes tens of seconds, and a
        # liveness probe that finds no port meanwhile would kill the pod (live: "starting")
        self._health = HealthServer(
            self.metrics.registry,
            port=self.settings.metrics_port,
            live=self.health,
            ready=self.ready,
        )
        try:
            self._health.start()
            async with (
                self.open_handler(self.metrics, publisher) as handler,
                self._journal() as journal,
            ):
                self.delivery = Delivery(
                    consumer=self.name,
                    handler=handler,
                    publisher=publisher,
                    settings=self.settings,
                    max_record_bytes=self.kafka.max_record_bytes,
                    metrics=self.metrics,
                    journal=journal,
                )
                self.delivery.start_at_zero(
                    self.topic,
                    dead_letter_causes=self.dead_letter_causes,
                    retry_causes=self.retry_causes,
                )
                self.metrics.registry.register(
                    oldest_in_flight(self.name, self.delivery.oldest_ages)
                )
                self.metrics.registry.register(
                    consumer_lag(self.name, self.settings.group_id, self.delivery.lags)
                )
                yield
        finally:
            if self._health is not None:
                self._health.stop()
            await publisher.stop()

    @asynccontextmanager
    async def _journal(self) -> AsyncIterator[PostgresJournal]:
        """The start journal on a pool of its own, and the probe that keeps its availability
        (the readiness) current while no record arrives."""
        pool = await create_pool(
            self.database.require_url(),
            timeout_s=self.database.connect_timeout_s,
            min_size=1,
            max_size=2,
            session_role=self.database.role,
        )
        self.journal = PostgresJournal(pool, group=self.settings.group_id)
        probe = asyncio.create_task(_probe(self.journal), name=f"{self.name}-database-probe")
        try:
            yield self.journal
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            try:
                await self.journal.close()
            finally:
                await pool.close()

    def ready(self) -> bool:
        """Started, not shutting down, and the database answers."""
        return self._ready and (self.journal is None or self.journal.available)

    def health(self) -> Health:
        if self.delivery is None:
            return Health(True, "starting")
        return self.delivery.health()

    async def _started(self) -> None:
        consumer = self.subscriber.consumer
        assert self.delivery is not None
        assert consumer is not None
        self.delivery.start(ConsumerCommitter(consumer))
        # What start-up loaded (the encoder stack, the libraries: some 80,000 objects) lives as
        # long as the process: out of the collector's sight, a full collection no longer walks
        # it (25 ms with the event loop stopped, measured) while records wait.
        gc.collect()
        gc.freeze()
        self._ready = True
        print(
            f"{self.name} consumer ready: topic {self.topic}, group {self.settings.group_id}, "
            f"{self.settings.max_in_flight} in flight, metrics port "
            f"{self.settings.metrics_port or 'off'}",
            flush=True,
        )

    async def _drain(self) -> None:
        self._ready = False
        consumer = self.subscriber.consumer
        if consumer is not None:
            consumer.pause(*consumer.assignment())  # fetch nothing more while draining
        if self.delivery is not None:
            await self.delivery.close()


_PROBE_INTERVAL_S = 2.0


async def _probe(journal: PostgresJournal) -> None:
    while True:
        await journal.check()
        await asyncio.sleep(_PROBE_INTERVAL_S)


def lazy_app(create: Callable[[], ConsumerApp]) -> Callable[[str], Any]:
    """A consumer module's ``__getattr__``: ``app`` (for ``faststream run module:app``), built
    from the environment once, on first access, so importing the module reads no setting."""
    built: list[Any] = []

    def module_attribute(name: str) -> Any:
        if name != "app":
            raise AttributeError(name)
        if not built:
            built.append(create().app)
        return built[0]

    return module_attribute
