"""Each consumer's behaviour suite, run twice: in memory and against the real broker.

A test of tests/behaviour/ talks to a :class:`Rig`: it starts a consumer, sends records, reads
topics. The ``memory`` rig runs the consumer's own :class:`~consumers.runtime.app.ConsumerApp`
in this process on a :class:`~consumers.runtime.inmemory.MemoryBroker`, its handler on the
domain's in-memory ports (no PostgreSQL): seconds for the whole suite. The ``broker`` rig runs
``contextcore serve <consumer>`` as its own process on the Tansu broker and PostgreSQL
(tests/services.py), as the integration tier does; it carries the ``integration`` marker.
The same assertions hold on both, so the in-memory run may be trusted as far as the suite goes.

The pending sweep is no record consumer: in memory it is its own
:class:`~consumers.knowledge.sweep.app.Sweeper` on the knowledge tables' in-memory sweep port,
publishing to the in-memory broker; on the broker, ``contextcore serve sweep``. Both sweep every
half second or faster, and :meth:`Rig.age_pending` is the hour it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Protocol

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import TopicSpec, ensure_topics
from consumers.build.app import create_app as build_app
from consumers.build.handler import BuildHandler
from consumers.build.metrics import BuildMetrics
from consumers.build.settings import BuildSettings
from consumers.build.sources import process_registry
from consumers.knowledge.embed.app import create_app as embed_app
from consumers.knowledge.embed.handler import EmbedHandler
from consumers.knowledge.embed.metrics import EmbedMetrics
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.sweep.app import Sweeper, SweepSettings
from consumers.knowledge.upload.app import create_app as upload_app
from consumers.knowledge.upload.handler import UploadHandler
from consumers.knowledge.upload.metrics import UploadMetrics
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.app import create_app as memory_app
from consumers.memory.handler import MemoryHandler
from consumers.memory.metrics import MemoryMetrics
from consumers.memory.settings import MemorySettings
from consumers.runtime.app import ConsumerApp, OpenHandler
from consumers.runtime.inmemory import (
    MemoryBroker,
    MemoryPublisher,
    MemoryStartJournal,
    MemoryTransport,
)
from consumers.runtime.journal import ServedJournal
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.transport import Publisher, RecordHandler
from contextcore.builder import DefaultContextBuilder
from contextcore.knowledge.embed import Embedder
from contextcore.knowledge.ingest import Ingestion
from contextcore.memory.service import MemoryService
from contextcore.packer import ContextPacker
from contextcore.storage.settings import DatabaseSettings
from tests.behaviour.journal import DictMemoryJournal
from tests.integration.helpers import producer, read_json
from tests.services import Config, ConsumerProcess, StartConsumer
from tests.unit.knowledge_fakes import (
    LIVE,
    WINDOW,
    Chunks,
    Clock,
    Lengths,
    Objects,
    Sources,
    SweepTables,
    Words,
)

SWEEP_INTERVAL_S = {"memory": 0.05, "broker": 0.5}
"""How often the sweep runs in the suite (its default is a minute)."""


class Rig(Protocol):
    topics: TopicSettings

    async def start(self, consumer: str) -> None:
        """Start ``consumer`` (build, memory, upload, embed, sweep) and return once it is
        ready."""

    async def stop(self, consumer: str, *, kill: bool = False) -> None:
        """Stop ``consumer``: drained and committed, or with ``kill`` as a process that dies
        (nothing more is committed)."""

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Publish one record, acknowledged."""

    async def read(self, topic: str, *, until: int) -> list[dict[str, Any]]:
        """``topic``'s records from the beginning, as JSON, once ``until`` arrived."""

    async def organization(self, organization_id: uuid.UUID) -> None:
        """Make the organization exist (the application owns that row)."""

    async def create_topic(self, topic: str) -> None:
        """Create ``topic`` with one partition (an existing topic is left as it is)."""

    async def age_pending(self, seconds: float) -> None:
        """Every knowledge source pending now has waited ``seconds`` longer (what comes after
        is new): the clock of the in-memory tables moves on, or the rows' ``pending_since``
        (what the database's sweep reads) go back."""

    def group(self, consumer: str) -> str:
        """The consumer's group id."""


def reply_topic(rig: Rig, name: str) -> str:
    return f"{rig.topics.reply_prefix}.{name}"


async def own_reply_topic(rig: Rig, name: str) -> str:
    """A reply topic of one partition, made before the first request as a client makes its own:
    the topic the broker creates on its first record may have several, and the statuses of one
    upload (``pending``, then the sweep's ``failed``) come from different producers, with no
    order across partitions."""
    topic = reply_topic(rig, name)
    await rig.create_topic(topic)
    return topic


class MemoryRig:
    """The consumers in this process, on a broker and journals in memory."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.topics = TopicSettings.model_construct(
            build_request=f"behaviour.{tag}.build-request",
            memory_write=f"behaviour.{tag}.memory-write",
            upload=f"behaviour.{tag}.upload",
            embed=f"behaviour.{tag}.embed",
            reply_prefix=f"behaviour.{tag}.reply",
        )
        self.reply_topics = ReplyTopics.of(self.topics)
        self.broker = MemoryBroker()
        self.memory_journal = DictMemoryJournal()
        self.clock = Clock()
        self.knowledge = Sources(self.clock)
        self.chunks = Chunks(self.knowledge)  # outlives an embedding member, as the table does
        self.sweep_tables = SweepTables(self.knowledge, self.chunks)
        self.start_journal = MemoryStartJournal()  # outlives a member, as the table does
        self._running: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._kafka = KafkaSettings.model_construct(bootstrap_servers="in-memory")
        self._database = DatabaseSettings.model_construct(url="postgresql://unused")

    def group(self, consumer: str) -> str:
        return f"behaviour-{consumer}"

    def app(self, consumer: str) -> ConsumerApp:
        """The consumer's own app, rewired to this rig's broker, journal and handler ports."""
        wiring: dict[str, tuple[Callable[..., ConsumerApp], type[ConsumerSettings], OpenHandler]]
        wiring = {
            "build": (build_app, BuildSettings, self._build_handler),
            "memory": (memory_app, MemorySettings, self._memory_handler),
            "upload": (upload_app, UploadSettings, self._upload_handler),
            "embed": (embed_app, EmbedSettings, self._embed_handler),
        }
        if consumer not in wiring:
            raise ValueError(f"no in-memory wiring for the {consumer} consumer")
        create, settings, handler = wiring[consumer]
        own = settings.model_construct(group_id=self.group(consumer), metrics_port=0)
        declared = create(own, self._kafka, self.topics, self._database)
        return declared.replace(
            transport=MemoryTransport(self.broker),
            open_handler=handler,
            open_journal=self._journal,
        )

    @asynccontextmanager
    async def _journal(self) -> AsyncIterator[ServedJournal]:
        yield self.start_journal

    @asynccontextmanager
    async def _build_handler(
        self, metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[RecordHandler]:
        registry = process_registry()  # the seven sources, admitted; none is read here
        build_metrics = BuildMetrics.create(metrics.registry)
        build_metrics.start_at_zero(registry.names)
        builder = DefaultContextBuilder(registry, ContextPacker(), observer=build_metrics)
        yield BuildHandler(registry, builder, build_metrics, reply_topics=self.reply_topics)

    @asynccontextmanager
    async def _memory_handler(
        self, metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[RecordHandler]:
        service = MemoryService(self.memory_journal)
        yield MemoryHandler(
            service, MemoryMetrics.create(metrics.registry), reply_topics=self.reply_topics
        )

    @asynccontextmanager
    async def _upload_handler(
        self, metrics: RuntimeMetrics, publisher: Publisher
    ) -> AsyncIterator[RecordHandler]:
        # the knowledge tables in a dict, objects under /docs only, a chunk per word
        ingestion = Ingestion(self.knowledge, Objects(), Words(), {LIVE: WINDOW}.get)
        yield UploadHandler(
            ingestion,
            publisher,
            self.topics.embed,
            UploadMetrics.create(metrics.registry),
            reply_topics=self.reply_topics,
        )

    @asynccontextmanager
    async def _embed_handler(
        self, metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[RecordHandler]:
        # the upload's tables in a dict, an encoder of the live model only
        embedder = Embedder(self.chunks, [Lengths(LIVE)])
        yield EmbedHandler(embedder, EmbedMetrics.create(metrics.registry))

    async def start(self, consumer: str) -> None:
        if consumer == "sweep":
            self._start_sweep()
            return
        app = self.app(consumer)
        stopping = asyncio.Event()
        task = asyncio.create_task(app.serve(stopping), name=f"behaviour-{consumer}")
        self._running[consumer] = (stopping, task)
        async with asyncio.timeout(30):
            while not app.ready():
                if task.done():
                    task.result()  # its error
                    raise AssertionError(f"the {consumer} consumer stopped before it was ready")
                await asyncio.sleep(0.01)

    def _start_sweep(self) -> None:
        """The sweep's own Sweeper on the knowledge tables in memory; ready at once, as
        ``serve`` says it is before its first sweep."""
        settings = SweepSettings.model_construct(
            interval_s=SWEEP_INTERVAL_S["memory"], metrics_port=0
        )
        publisher = MemoryPublisher(self.broker)
        sweeper = Sweeper(settings, self.sweep_tables, publisher, reply_topics=self.reply_topics)
        stopping = asyncio.Event()
        task = asyncio.create_task(sweeper.run(stopping), name="behaviour-sweep")
        self._running["sweep"] = (stopping, task)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        await self.broker.publish(topic, value, key=key, headers=headers)

    async def read(self, topic: str, *, until: int) -> list[dict[str, Any]]:
        records = await self.broker.wait_for(topic, until, timeout_s=60)
        return [json.loads(record.value or b"") for record in records]

    async def organization(self, organization_id: uuid.UUID) -> None:
        pass  # the in-memory journal has no organizations table

    async def create_topic(self, topic: str) -> None:
        self.broker.create_topic(topic, 1)

    async def age_pending(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def stop(self, consumer: str, *, kill: bool = False) -> None:
        stopping, task = self._running.pop(consumer)
        if kill:  # no drain, no last commit: what was in flight is read again
            task.cancel()
        else:
            stopping.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for consumer in list(self._running):
            await self.stop(consumer)


class BrokerRig:
    """The consumers as ``contextcore serve`` processes on the Tansu broker and PostgreSQL."""

    def __init__(
        self,
        config: Config,
        start_consumer: StartConsumer,
        admin: asyncpg.Connection,
    ) -> None:
        self.config = config.with_("sweep", interval_s=SWEEP_INTERVAL_S["broker"])
        self.topics = config.topics
        self._start_consumer = start_consumer
        self._admin = admin
        self._producer: AIOKafkaProducer | None = None
        self._processes: dict[str, ConsumerProcess] = {}

    def group(self, consumer: str) -> str:
        settings = getattr(self.config, consumer)
        group: str = settings.group_id
        return group

    async def start(self, consumer: str) -> None:
        self._processes[consumer] = await self._start_consumer(self.config, consumer=consumer)

    async def stop(self, consumer: str, *, kill: bool = False) -> None:
        await self._processes.pop(consumer).stop(signal.SIGKILL if kill else signal.SIGTERM)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        if self._producer is None:
            self._producer = await producer(self.config.bootstrap)
        await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))

    async def read(self, topic: str, *, until: int) -> list[dict[str, Any]]:
        return await read_json(self.config.bootstrap, topic, until=until)

    async def organization(self, organization_id: uuid.UUID) -> None:
        await self._admin.execute(
            "INSERT INTO organizations (id, name) VALUES ($1, 'behaviour')", organization_id
        )

    async def create_topic(self, topic: str) -> None:
        await ensure_topics(self.config.bootstrap, [TopicSpec(topic, 1)])

    async def age_pending(self, seconds: float) -> None:
        for table in ("knowledge_sources", "knowledge_source_models"):  # a source, its models
            await self._admin.execute(
                f"UPDATE {table} SET pending_since = pending_since - $1::interval"
                " WHERE status = 'pending'",
                timedelta(seconds=seconds),
            )

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


@pytest.fixture(params=["memory", pytest.param("broker", marks=pytest.mark.integration)])
def rig(request: pytest.FixtureRequest) -> Rig:
    """The test's rig: in memory, then on the real broker."""
    chosen: Rig = request.getfixturevalue(f"{request.param}_rig")
    return chosen


@pytest.fixture
async def memory_rig() -> AsyncIterator[MemoryRig]:
    memory = MemoryRig()
    try:
        yield memory
    finally:
        await memory.close()


@pytest.fixture
async def broker_rig(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> AsyncIterator[BrokerRig]:
    broker = BrokerRig(config, start_consumer, admin)
    try:
        yield broker
    finally:
        await broker.close()
