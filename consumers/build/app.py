"""The build consumer's application.

    contextcore serve build

Start-up fails closed: the schema must match the code's migrations (checked as the service
role, the only privilege the runtime login has), the topics must exist, and the dossier
listener must be up before the first record is fetched. Sources read the replica when
``CONTEXTCORE_DATABASE_READ_URL`` is set; the dossier invalidations are NOTIFYs, which only the
primary delivers, and a request naming a position the replica has not replayed reads the
primary (read_after.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import asyncpg

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import build_topics
from consumers.build.handler import BuildHandler
from consumers.build.metrics import BuildMetrics, CacheStatistics, RoundTrips
from consumers.build.read_after import Primary, Readers
from consumers.build.replica_lag import watching_lag
from consumers.build.settings import BuildSettings
from consumers.build.sources import SourceCaches, process_registry
from consumers.runtime.app import ConsumerApp
from consumers.runtime.compose import Environment, consumer_app, reply_channel
from consumers.runtime.database import verified_pool
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.builder import ContextBuilder, DefaultContextBuilder
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.settings import Encoders, KnowledgeSettings
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from contextcore.storage.invalidation import CacheInvalidator
from contextcore.storage.positions import PrimaryWatch, ReplayWatch
from contextcore.storage.quotas import DatabaseQuotas
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import TenantDatabase
from schemas.build import BuildReplyV1, BuildRequestV1

log = logging.getLogger("contextcore.build")

DESCRIPTION = (
    "Build requests: a ContextRequest and a ContextPolicy. Every record is answered on the "
    "topic its reply_to names, with its correlation_id: a brief, an error, or reuse_previous; "
    "a record without a usable address goes to the dead-letter topic."
)


@asynccontextmanager
async def primary_pool(
    database: DatabaseSettings, read_url: str
) -> AsyncIterator[asyncpg.Pool | None]:
    """A pool on the primary for the builds that must read a write the replica has not
    replayed yet (read_after.py); ``None`` when the sources read the primary anyway. It opens
    one connection and grows only while the replica lags behind such requests."""
    if read_url == database.require_url():
        yield None
        return
    async with verified_pool(database, opened=1) as pool:
        yield pool


GONE = ("CONTEXTCORE_BUILD_ORGANIZATION_RATE", "CONTEXTCORE_BUILD_ORGANIZATION_BURST")
"""Settings of an earlier version that a deployment may still set: warned about, not read."""


def create_app(
    build: BuildSettings | None = None,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    database: DatabaseSettings | None = None,
    knowledge: KnowledgeSettings | None = None,
) -> ConsumerApp:
    """The application, configured from the environment unless settings are given."""
    build = build or BuildSettings()
    for gone in GONE:
        if os.environ.get(gone):
            log.warning(
                "%s is no longer read: a build rate is the quota build_rate of an organization, "
                "or of every organization by default (`contextcore quota`, docs/operations.md)",
                gone,
            )
    env = Environment.of(kafka, topics, database)
    open_handler = partial(open_build_handler, build, env, knowledge or KnowledgeSettings())
    return consumer_app(
        env,
        name="build",
        topic=env.topics.build_request,
        topics=build_topics(env.topics),
        settings=build,
        description=DESCRIPTION,
        payload=BuildRequestV1,
        publishes=[
            reply_channel(
                "build-reply",
                "The answer to one build request, on the topic the request named, with its "
                "correlation_id: status ok (a brief), error (a code and details) or "
                "reuse_previous.",
                BuildReplyV1,
            )
        ],
        open_handler=open_handler,
    )


@asynccontextmanager
async def open_build_handler(
    build: BuildSettings,
    env: Environment,
    knowledge: KnowledgeSettings,
    metrics: RuntimeMetrics,
    _publisher: Publisher,
) -> AsyncIterator[BuildHandler]:
    """The handler of one process: its pools (the sources' database, and the primary when
    they read a replica), the dossier listener, the encoders, the readers, the quotas."""
    database = env.database
    url = database.require_url()
    caches = SourceCaches()
    invalidator = CacheInvalidator(caches.by_channel(), url)
    read_url = database.read_url or url
    async with (
        verified_pool(database, url=read_url, opened=database.pool_size) as pool,
        watching_lag(pool, metrics.registry, every_s=build.replica_lag_interval_s),
        primary_pool(database, read_url) as primary_reads,
    ):
        try:
            await invalidator.start()
            encoders = Encoders(knowledge)
            build_metrics = BuildMetrics.create(metrics.registry)
            tenants = TenantDatabase(pool, role=database.role)
            metrics.registry.register(RoundTrips(tenants))
            vectors = QueryVectors(encoders)
            metrics.registry.register(CacheStatistics([*caches.by_channel().values(), vectors]))
            builders = Builders(build, database, caches, vectors, build_metrics)
            registry = builders.sources_on(tenants)  # the read database's: admission uses it too
            readers = builders.readers(registry, pool, primary_reads)
            build_metrics.start_at_zero(registry.names)
            if build.preload_encoder:
                await preload(encoders, knowledge)
            yield BuildHandler(
                registry,
                readers,
                build_metrics,
                reply_topics=env.reply_topics,
                quotas=DatabaseQuotas(tenants, ttl_s=build.quotas_ttl_s),
            )
        finally:
            await invalidator.stop()


@dataclass(frozen=True)
class Builders:
    """The builders of one process: one per database its sources may read."""

    build: BuildSettings
    database: DatabaseSettings
    caches: SourceCaches
    vectors: QueryVectors
    metrics: BuildMetrics

    def sources_on(self, database: TenantDatabase) -> ContextSourceRegistry:
        return process_registry(
            database,
            self.caches,
            vectors=self.vectors,
            on_memory_drop=self.metrics.memory_drop_hook(),
        )

    def builder_of(self, registry: ContextSourceRegistry) -> ContextBuilder:
        return DefaultContextBuilder(
            registry,
            ContextPacker(),
            source_timeout_s=self.build.source_timeout_s,
            observer=self.metrics,
        )

    def readers(
        self,
        registry: ContextSourceRegistry,
        pool: asyncpg.Pool,
        primary_reads: asyncpg.Pool | None,
    ) -> Readers:
        """The read database's builder, and the primary's for the requests the read one has
        not replayed (read_after.py); none when the sources read the primary anyway."""
        primary = None
        if primary_reads is not None:
            on_primary = self.sources_on(TenantDatabase(primary_reads, role=self.database.role))
            primary = Primary(
                self.builder_of(on_primary),
                replay=ReplayWatch(pool),
                written=PrimaryWatch(primary_reads),
            )
        return Readers(read=self.builder_of(registry), metrics=self.metrics, primary=primary)


async def preload(encoders: Encoders, knowledge: KnowledgeSettings) -> None:
    """Every model's query encoder loaded and its first inference run (allocations, a compiled
    graph's first run): on a busy machine it cost the first build's knowledge read its 1 s
    timeout (the demo's, in CI)."""
    for model in knowledge.models():
        encoder = await encoders(model)
        await asyncio.to_thread(encoder.encode, ["warm up"])
