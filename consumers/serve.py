"""``contextcore serve build``: the build consumer process.

Start-up fails closed: the schema must match the code's migrations, the topics must exist, and
the dossier listener must be up before the first request is consumed.
"""

from __future__ import annotations

import asyncio
import signal

from consumers.build import BuildConsumer
from consumers.metrics import BuildMetrics, count_source_failure, serve_metrics
from consumers.sources import process_registry
from consumers.topics import build_topics, ensure_topics
from contextcore.builder import DefaultContextBuilder
from contextcore.errors import InfrastructureUnavailable
from contextcore.packer import ContextPacker
from contextcore.settings import Settings
from contextcore.sources.dossier import Fact
from contextcore.sources.dossier_cache import DossierCache, DossierInvalidator
from contextcore.storage import migrations
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.tenancy import TenantDatabase


async def _verify_schema(settings: Settings) -> None:
    conn = await connect(
        settings.require_database_url(), timeout_s=settings.database_connect_timeout_s
    )
    try:
        await migrations.verify(conn)
    finally:
        await conn.close()


async def serve_build(settings: Settings) -> None:
    """Fail closed on a schema mismatch, make sure the topics exist, then consume until a signal."""
    bootstrap = settings.require_bootstrap_servers()
    database_url = settings.require_database_url()
    await _verify_schema(settings)
    await ensure_topics(
        bootstrap, build_topics(settings), timeout_s=settings.kafka_connect_timeout_s
    )
    # Sources read the replica when one is configured; the dossier invalidations are NOTIFYs,
    # which only the primary delivers.
    pool = await create_pool(
        settings.database_read_url or database_url,
        timeout_s=settings.database_connect_timeout_s,
        max_size=settings.database_pool_size,
    )
    cache: DossierCache[list[Fact]] = DossierCache()
    invalidator = DossierInvalidator(cache, database_url)
    try:
        await invalidator.start()
        registry = process_registry(TenantDatabase(pool, role=settings.database_role), cache)
        metrics = BuildMetrics.create()
        builder = DefaultContextBuilder(
            registry,
            ContextPacker(),
            source_timeout_s=settings.source_timeout_s,
            on_source_failure=count_source_failure(metrics),
        )
        consumer = BuildConsumer(settings, registry=registry, builder=builder, metrics=metrics)
        serve_metrics(consumer.metrics.registry, settings.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await consumer.broker.start()
        except Exception as error:
            raise InfrastructureUnavailable(f"cannot start the build consumer: {error}") from error
        print(
            f"build consumer ready: topic {settings.topic_build_request}, group "
            f"{settings.build_group_id}, sources {', '.join(registry.names)}, metrics port "
            f"{settings.metrics_port or 'off'}",
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            await consumer.broker.stop()
    finally:
        await invalidator.stop()
        await pool.close()
