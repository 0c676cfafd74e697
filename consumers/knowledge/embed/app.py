"""The embedding group's application: its own topic, its own group, scaled on its own.

    contextcore serve embed

The model loads once at start-up (an OpenVINO export is cached under
``CONTEXTCORE_KNOWLEDGE_CACHE_DIR``) before the first batch is fetched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import embed_topics
from consumers.knowledge.embed.handler import EmbedHandler
from consumers.knowledge.embed.metrics import EmbedMetrics, TimedEncoder
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from consumers.runtime.database import verified_pool
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.adapters.store import PostgresChunkStore
from contextcore.knowledge.embed import Embedder
from contextcore.settings import DatabaseSettings
from contextcore.storage.positions import write_position
from contextcore.storage.tenancy import TenantDatabase
from schemas.upload import EmbedBatchV1, UploadStatusV1

DESCRIPTION = (
    "Batches of chunks to embed under a pinned model and store in pgvector. The batch that "
    "completes a source under its live model answers the upload's reply_to with ready."
)


def create_app(
    embed: EmbedSettings | None = None,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    database: DatabaseSettings | None = None,
    knowledge: KnowledgeSettings | None = None,
) -> ConsumerApp:
    embed = embed or EmbedSettings()
    kafka = kafka or KafkaSettings()
    topics = topics or TopicSettings()
    database = database or DatabaseSettings()
    knowledge = knowledge or KnowledgeSettings()

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[EmbedHandler]:
        async with verified_pool(database) as pool:
            encoders = [
                await asyncio.to_thread(knowledge.load_encoder, model)
                for model in knowledge.models()
            ]
            embed_metrics = EmbedMetrics.create(metrics.registry)
            embedder = Embedder(
                PostgresChunkStore(TenantDatabase(pool, role=database.role)),
                [TimedEncoder(encoder, embed_metrics) for encoder in encoders],
            )
            for model in knowledge.models():  # each model's count starts at 0
                embed_metrics.chunks.labels(model)
            yield EmbedHandler(embedder, embed_metrics, position=partial(write_position, pool))

    return ConsumerApp(
        name="embed",
        topic=topics.embed,
        description=DESCRIPTION,
        payload=EmbedBatchV1,
        publishes=[
            Channel(
                "{reply_to}",
                "upload-status",
                "ready, on the topic the upload named, once every chunk of its source is stored.",
                UploadStatusV1,
            )
        ],
        settings=embed,
        kafka=kafka,
        database=database,
        topics=embed_topics(topics),
        reply_topics=ReplyTopics.of(topics),  # the uploaders' addresses, read from their rows
        open_handler=open_handler,
        dead_letter_causes=("unknown_model",),
    )
