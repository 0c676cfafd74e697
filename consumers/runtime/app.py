"""One consumer's process: group membership, the fetch loop and the lifecycle, its records fed
to a :class:`~consumers.runtime.delivery.Delivery`.

The loop is ours (docs/delivery.md, "The runtime"), on the ports of
consumers/runtime/transport.py: a member of the group (a
:class:`~consumers.runtime.transport.RecordSource`) fetches batches and the loop hands every
record to the delivery, which runs up to ``max_in_flight`` of them and commits each partition's
position itself, after the outcome was published; nothing commits on its own. The transport is
Kafka (:class:`~consumers.runtime.kafka.KafkaTransport`) unless another is given: the behaviour
suites (tests/behaviour/) run the same app in memory (consumers/runtime/inmemory.py) too.
``contextcore serve build`` runs it. The AsyncAPI document comes from the same declarations
(:attr:`ConsumerApp.declaration`, consumers/runtime/asyncapi.py, ``docs/asyncapi/``).

Start-up fails closed before the first record is fetched: the broker must answer, the topics
exist, and ``open_handler`` has checked the schema and opened what the handler needs. SIGTERM
or SIGINT drains: fetching pauses, the records in flight finish and commit, then the member
leaves the group.

Every consumer counts the records it starts in the database's start journal
(:mod:`consumers.runtime.journal`), through a pool of its own, and probes the database every
``_PROBE_INTERVAL_S``: ``/readyz`` says not ready while it does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from pydantic import BaseModel

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings
from broker.topics import TopicSpec
from consumers.runtime import tracing
from consumers.runtime.asyncapi import Channel, Declaration
from consumers.runtime.decoding import DEAD_LETTER_CAUSES
from consumers.runtime.delivery import Delivery
from consumers.runtime.health import Health, HealthServer
from consumers.runtime.journal import PostgresJournal, ServedJournal
from consumers.runtime.kafka import KafkaTransport
from consumers.runtime.metrics import RuntimeMetrics, consumer_lag, oldest_in_flight
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import TopicPartition
from consumers.runtime.transport import Publisher, RecordHandler, RecordSource, Transport
from contextcore.storage.pool import create_pool
from contextcore.storage.settings import DatabaseSettings
from schemas.errors import ConfigurationError

OpenHandler = Callable[[RuntimeMetrics, Publisher], AbstractAsyncContextManager[RecordHandler]]
OpenJournal = Callable[[], AbstractAsyncContextManager[ServedJournal]]

log = logging.getLogger("contextcore.consumer")


def yield_cpu(settings: ConsumerSettings) -> None:
    """Lower this process's CPU priority as ``settings`` say (``nice``, ``cpu_policy``). Called
    before any thread starts: the encoder's threads and the extraction workers inherit it."""
    if settings.nice:
        os.nice(settings.nice)
    if settings.cpu_policy == "idle":
        if hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            log.warning(
                "cpu_policy idle needs Linux's SCHED_IDLE: running at nice %d only", settings.nice
            )


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
        reply_topics: ReplyTopics,
        open_handler: OpenHandler,
        version: str = "1",
        dead_letter_causes: Sequence[str] = (),
        retry_causes: Sequence[str] = (),
        transport: Transport | None = None,
        open_journal: OpenJournal | None = None,
    ) -> None:
        """``reply_topics``: the topics a reply may go to, checked again for every reply the
        delivery publishes. ``dead_letter_causes`` and ``retry_causes``: the handler's own,
        beside the runtime's and the decoder's; their series start at 0. ``transport``: Kafka
        unless given; ``open_journal``: the start journal in PostgreSQL unless given."""
        self._arguments: dict[str, Any] = {
            key: value for key, value in locals().items() if key not in ("self", "__class__")
        }
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
        self.reply_topics = reply_topics
        self.open_handler = open_handler
        self.transport: Transport = transport or KafkaTransport(kafka)
        self.open_journal: OpenJournal = open_journal or self._postgres_journal
        self.metrics = RuntimeMetrics.create()
        self.dead_letter_causes = (*DEAD_LETTER_CAUSES, *dead_letter_causes)
        self.retry_causes = tuple(retry_causes)
        self.delivery: Delivery | None = None
        self.journal: ServedJournal | None = None
        self._health: HealthServer | None = None
        self._ready = False
        self.fetch_max_wait_ms = (
            kafka.fetch_max_wait_ms
            if settings.fetch_max_wait_ms is None
            else settings.fetch_max_wait_ms
        )
        self.declaration = Declaration(name, version, description, topic, payload, publishes)
        """What the AsyncAPI document is made from (consumers/runtime/asyncapi.py)."""

    def replace(self, **changes: Any) -> ConsumerApp:
        """A new app of the same declaration with ``changes`` to its arguments (another
        ``transport``, ``open_handler`` or ``open_journal``: the in-memory behaviour suites)."""
        return ConsumerApp(**{**self._arguments, **changes})

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then drain and leave the group; spans go over OTLP
        when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (consumers/runtime/tracing.py)."""
        yield_cpu(self.settings)
        exporting = tracing.export_from_environment(self.name)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for signum in signals:
            loop.add_signal_handler(signum, stopping.set)
        try:
            await self.serve(stopping)
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            exporting.shutdown()

    async def serve(self, stopping: asyncio.Event) -> None:
        """Start, fetch and deliver until ``stopping`` is set, then drain: fetch nothing more,
        let the records in flight finish and commit, and leave the group."""
        async with self._lifespan():
            source = self.transport.source(
                topic=self.topic,
                group_id=self.settings.group_id,
                client_id=f"contextcore-{self.name}",
                fetch_max_wait_ms=self.fetch_max_wait_ms,
                rebalance=self,
            )
            await source.start()
            fetching: asyncio.Task[None] | None = None
            try:
                self._started(source)
                fetching = asyncio.create_task(self._fetch(source), name=f"{self.name}-fetch")
                stopped = asyncio.create_task(stopping.wait())
                await asyncio.wait({fetching, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                self._ready = False
                source.pause()  # fetch nothing more while draining
                if self.delivery is not None:
                    await self.delivery.close()
            finally:
                if fetching is not None:
                    fetching.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await fetching
                await source.stop()

    async def _fetch(self, source: RecordSource) -> None:
        """Fetch and hand each record to the delivery until the source stops. A slot the
        delivery does not have holds the fetch (the records wait in the broker, not here)."""
        max_records = self.settings.max_in_flight
        while (records := await source.fetch(max_records, _FETCH_TIMEOUT_MS)) is not None:
            if not records:
                continue
            delivery = self.delivery
            assert delivery is not None  # set before the first fetch
            delivery.received(records)  # the lag counts records still waiting for a slot
            for record in records:
                await delivery.submit(record)

    # the group's rebalances (transport.Rebalance), told to the delivery

    def assigned(self, partitions: list[TopicPartition]) -> None:
        if self.delivery is not None:
            self.delivery.assign(partitions)

    async def revoked(self, partitions: list[TopicPartition]) -> None:
        """Drain the records of ``partitions`` and commit, before the group hands them on."""
        if self.delivery is not None:
            await self.delivery.revoke(partitions)

    @asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[None]:
        await self.transport.ensure_topics(self.topics)
        publisher = self.transport.publisher(client_id=f"contextcore-{self.name}")
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
                self._served_journal() as journal,
            ):
                self.delivery = Delivery(
                    consumer=self.name,
                    handler=handler,
                    publisher=publisher,
                    settings=self.settings,
                    max_record_bytes=self.kafka.max_record_bytes,
                    metrics=self.metrics,
                    reply_topics=self.reply_topics,
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
    async def _postgres_journal(self) -> AsyncIterator[ServedJournal]:
        """The start journal on a pool of its own."""
        pool = await create_pool(
            self.database.require_url(),
            timeout_s=self.database.connect_timeout_s,
            min_size=1,
            max_size=2,
            session_role=self.database.role,
        )
        journal = PostgresJournal(pool, group=self.settings.group_id)
        try:
            yield journal
        finally:
            try:
                await journal.close()
            finally:
                await pool.close()

    @asynccontextmanager
    async def _served_journal(self) -> AsyncIterator[ServedJournal]:
        """The journal ``open_journal`` opens, and the probe that keeps its availability (the
        readiness) current while no record arrives."""
        async with self.open_journal() as journal:
            self.journal = journal
            probe = asyncio.create_task(_probe(journal), name=f"{self.name}-database-probe")
            try:
                yield journal
            finally:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe

    def ready(self) -> bool:
        """Started, not shutting down, and the database answers."""
        return self._ready and (self.journal is None or self.journal.available)

    def health(self) -> Health:
        if self.delivery is None:
            return Health(True, "starting")
        return self.delivery.health()

    def _started(self, source: RecordSource) -> None:
        assert self.delivery is not None
        self.delivery.start(source.committer)
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


_FETCH_TIMEOUT_MS = 200
"""How long one fetch waits for a record when none is buffered (the loop then asks again)."""
_PROBE_INTERVAL_S = 2.0


async def _probe(journal: ServedJournal) -> None:
    while True:
        await journal.check()
        await asyncio.sleep(_PROBE_INTERVAL_S)
