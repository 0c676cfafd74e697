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

import asyncpg

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import build_topics
from consumers.build.handler import BuildHandler
from consumers.build.metrics import BuildMetrics, CacheStatistics, RoundTrips
from consumers.build.read_after import Primary, Readers
from consumers.build.replica_lag import watching_lag
from consumers.build.settings import BuildSettings
from consumers.build.sources import SourceCaches, process_registry
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from consumers.runtime.database import verified_pool
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.builder import ContextBuilder, DefaultContextBuilder
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.settings import Encoders, KnowledgeSettings
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from contextcore.settings import DatabaseSettings
from contextcore.storage.invalidation import CacheInvalidator
from contextcore.storage.positions import PrimaryWatch, ReplayWatch
from contextcore.storage.quotas import DatabaseQuotas
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
    kafka = kafka or KafkaSettings()
    topics = topics or TopicSettings()
    database = database or DatabaseSettings()
    knowledge = knowledge or KnowledgeSettings()
    reply_topics = ReplyTopics.of(topics)

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[BuildHandler]:
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

                def sources_on(database: TenantDatabase) -> ContextSourceRegistry:
                    return process_registry(
                        database,
                        caches,
                        vectors=vectors,
                        on_memory_drop=build_metrics.memory_drop_hook(),
                    )

                def builder_of(registry: ContextSourceRegistry) -> ContextBuilder:
                    return DefaultContextBuilder(
                        registry,
                        ContextPacker(),
                        source_timeout_s=build.source_timeout_s,
                        observer=build_metrics,
                    )

                registry = sources_on(tenants)  # the read database's: admission uses it too
                readers = Readers(
                    read=builder_of(registry),
                    metrics=build_metrics,
                    primary=None
                    if primary_reads is None
                    else Primary(
                        builder_of(sources_on(TenantDatabase(primary_reads, role=database.role))),
                        replay=ReplayWatch(pool),
                        written=PrimaryWatch(primary_reads),
                    ),
                )
                build_metrics.start_at_zero(registry.names)
                if build.preload_encoder:
                    for model in knowledge.models():
                        encoder = await encoders(model)
                        # its first inference too (allocations, a compiled graph's first
                        # run): on a busy machine it cost the first build's knowledge read
                        # its 1 s timeout (the demo's, in CI)
                        await asyncio.to_thread(encoder.encode, ["warm up"])
                yield BuildHandler(
                    registry,
                    readers,
                    build_metrics,
                    reply_topics=reply_topics,
                    quotas=DatabaseQuotas(tenants, ttl_s=build.quotas_ttl_s),
                )
            finally:
                await invalidator.stop()

    return ConsumerApp(
        name="build",
        topic=topics.build_request,
        description=DESCRIPTION,
        payload=BuildRequestV1,
        publishes=[
            Channel(
                "{reply_to}",
                "build-reply",
                "The answer to one build request, on the topic the request named, with its "
                "correlation_id: status ok (a brief), error (a code and details) or "
                "reuse_previous.",
                BuildReplyV1,
            )
        ],
        settings=build,
        kafka=kafka,
        database=database,
        topics=build_topics(topics),
        reply_topics=reply_topics,
        open_handler=open_handler,
    )
