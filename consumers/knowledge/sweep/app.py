"""The pending sweep: every ``interval_s``, fail the knowledge sources pending for more than
``older_than_s`` (never under an hour), tell each uploader on the reply topic its upload named
(when the reply-topic rule allows it: :func:`consumers.knowledge.replies.tell`), and count
them; and keep the two bookkeeping tables bounded: the processed-message ledger's claims
older than ``ledger_retention_s`` and the start journal's rows older than
``journal_retention_s`` (a group or a topic no member commits any more) go, in bounded batches.

    contextcore serve sweep

Any number of sweepers may run: the database function takes its rows with ``SKIP LOCKED``, so
two never fail one source twice. It serves ``/metrics``, ``/healthz`` (a sweep that has not
finished within three intervals is not live) and ``/readyz``.

The :class:`Sweeper` runs on a :class:`SweepStore`, its port to the tables, declared here:
:class:`~consumers.knowledge.sweep.postgres.PostgresSweepStore` in production (``serve``), one
in memory in the tests (tests/unit/knowledge_fakes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from consumers.knowledge import replies
from consumers.knowledge.sweep.postgres import PostgresSweepStore
from consumers.runtime.database import verify_schema
from consumers.runtime.health import Health, HealthServer
from consumers.runtime.kafka import AiokafkaPublisher
from consumers.runtime.metrics import schema_info
from consumers.runtime.transport import Publisher
from contextcore.knowledge.adapters import indexes
from contextcore.knowledge.adapters.store import SourceCounts, Swept
from contextcore.storage.settings import DatabaseSettings
from schemas.errors import InfrastructureUnavailable

log = logging.getLogger("contextcore.sweep")


class SweepSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_SWEEP_", extra="ignore", frozen=True)

    interval_s: float = Field(default=60.0, gt=0)
    older_than_s: float = Field(default=3600.0, ge=3600.0)
    """The spec's hour; the database refuses to fail anything younger whatever this says."""
    batch: int = Field(default=500, ge=1, le=100_000)
    metrics_port: int = Field(default=9467, ge=0, le=65535)
    ledger_retention_s: float = Field(default=7 * 86_400, ge=86_400)
    """How long a processed-message claim is kept (the database keeps at least a day): a
    redelivery older than this would apply its effect again."""
    journal_retention_s: float = Field(default=7 * 86_400, ge=3_600)
    prune_batch: int = Field(default=10_000, ge=1, le=1_000_000)
    index_min_chunks: int = Field(default=indexes.MIN_CHUNKS, ge=100)
    """The size at which a tenant should have its own HNSW index (the indexer job's
    ``--min-chunks``): the gauge counts the tenants past it without one."""


class SweepSession(Protocol):
    """One sweep's view of the tables (in PostgreSQL one connection). Each call is a statement
    of its own: what one did stays done if a later one fails."""

    async def fail_stale(self, older_than: timedelta, batch: int) -> list[Swept]:
        """Fail up to ``batch`` sources (or a source's per-model states) pending for longer
        than ``older_than``, never less than an hour whatever is asked, the longest pending
        first, across tenants; each with its reason and its uploader's address."""

    async def source_counts(self) -> SourceCounts:
        """Every tenant's sources by status and the oldest pending one's age."""

    async def unindexed_tenants(self, min_chunks: int) -> int:
        """How many tenants (organization, model) hold ``min_chunks`` or more chunks without a
        valid index of their own."""

    async def prune_ledger(self, older_than: timedelta, batch: int) -> int:
        """Delete up to ``batch`` processed-message claims older than ``older_than`` (never
        younger than a day); how many went."""

    async def prune_journal(self, older_than: timedelta, batch: int) -> int:
        """Delete up to ``batch`` start-journal rows last started before ``older_than``; how
        many went."""


class SweepStore(Protocol):
    """Where the sweep's tables are: a session per sweep."""

    def session(self) -> AbstractAsyncContextManager[SweepSession]:
        """One sweep's session, closed when the sweep is done with the tables."""


class Sweeper:
    def __init__(
        self,
        settings: SweepSettings,
        store: SweepStore,
        publisher: Publisher,
        registry: CollectorRegistry | None = None,
        *,
        reply_topics: ReplyTopics | None = None,
    ) -> None:
        """``reply_topics``: where a status may go; the environment's topic settings' rule
        unless given."""
        self.settings = settings
        self.store = store
        self.publisher = publisher
        self.reply_topics = reply_topics or ReplyTopics.of(TopicSettings())
        self.registry = registry or CollectorRegistry()
        self.failed = Counter(
            "contextcore_knowledge_sources_swept_total",
            "Knowledge sources (or per-model states) failed by the pending sweep.",
            registry=self.registry,
        )
        self.last_sweep = Gauge(
            "contextcore_sweep_last_success_timestamp_seconds",
            "When the last sweep finished.",
            registry=self.registry,
        )
        self.sources = Gauge(
            "contextcore_knowledge_sources",
            "Knowledge sources of every tenant by status (pending, ready, failed), counted after "
            "each sweep.",
            ["status"],
            registry=self.registry,
        )
        self.unindexed = Gauge(
            "contextcore_knowledge_tenants_without_index",
            "Tenants (organization and model) at or past the index threshold without a valid "
            "HNSW index of their own, searched by an exact scan until the indexer job builds it.",
            registry=self.registry,
        )
        self.oldest_pending = Gauge(
            "contextcore_knowledge_oldest_pending_seconds",
            "How long the oldest pending knowledge source has waited (0 when none is pending); "
            "the sweep fails it after an hour.",
            registry=self.registry,
        )
        schema_info(self.registry)
        self._finished_at = time.monotonic()

    def health(self) -> Health:
        age = time.monotonic() - self._finished_at
        if age > 3 * self.settings.interval_s + 30:
            return Health(False, f"no sweep has finished for {age:.0f} s")
        return Health(True, "ok")

    async def sweep_once(self) -> list[Swept]:
        async with self.store.session() as tables:
            swept = await self._fail_stale(tables)
            counts = await tables.source_counts()
            unindexed = await tables.unindexed_tenants(self.settings.index_min_chunks)
            await self._prune(tables)
        for status, count in counts.by_status.items():
            self.sources.labels(status).set(count)
        self.oldest_pending.set(counts.oldest_pending_seconds or 0.0)
        self.unindexed.set(unindexed)
        for row in swept:
            self.failed.inc()
            log.warning("swept %s (%s): %s", row.source_id, row.title, row.reason)
            await self._tell(row)
        self._finished_at = time.monotonic()
        self.last_sweep.set_to_current_time()
        return swept

    async def _fail_stale(self, tables: SweepSession) -> list[Swept]:
        """Bounded batches until one comes back short: nothing stale is left."""
        older_than = timedelta(seconds=self.settings.older_than_s)
        swept: list[Swept] = []
        while True:
            batch = await tables.fail_stale(older_than, self.settings.batch)
            swept.extend(batch)
            if len(batch) < self.settings.batch:
                return swept

    async def _prune(self, tables: SweepSession) -> None:
        """Bounded batches of expired claims and journal rows, until none is left."""
        settings = self.settings
        for prune, retention_s in (
            (tables.prune_ledger, settings.ledger_retention_s),
            (tables.prune_journal, settings.journal_retention_s),
        ):
            older_than = timedelta(seconds=retention_s)
            while await prune(older_than, settings.prune_batch) == settings.prune_batch:
                pass

    async def _tell(self, row: Swept) -> None:
        if row.reply_to is None or row.correlation_id is None:
            return
        message = replies.swept(row.source_id, row.reason, row.correlation_id)
        why = await replies.tell(self.publisher, self.reply_topics, row.reply_to, message)
        if why is not None:  # the uploader may be gone; the row says why it failed
            log.warning("could not tell %s: %s", row.reply_to, why)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep_once()
            except (InfrastructureUnavailable, OSError) as error:
                log.error("sweep failed: %s", error)
            except Exception:
                log.exception("sweep failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.interval_s)


async def serve(
    settings: SweepSettings | None = None,
    database: DatabaseSettings | None = None,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
) -> None:
    settings = settings or SweepSettings()
    database = database or DatabaseSettings()
    kafka = kafka or KafkaSettings()
    reply_topics = ReplyTopics.of(topics or TopicSettings())
    await verify_schema(database)
    publisher = AiokafkaPublisher(kafka, client_id="contextcore-sweep")
    await publisher.start()
    sweeper = Sweeper(settings, PostgresSweepStore(database), publisher, reply_topics=reply_topics)
    health = HealthServer(
        sweeper.registry, port=settings.metrics_port, live=sweeper.health, ready=lambda: True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health.start()
    print(
        f"sweep ready: every {settings.interval_s:g} s, metrics port {settings.metrics_port}",
        flush=True,  # a supervisor (or a test) reading the pipe waits for this line
    )
    try:
        await sweeper.run(stop)
    finally:
        health.stop()
        await publisher.stop()
