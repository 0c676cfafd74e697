"""The embedding group's application: its own topic, its own group, scaled on its own.

    contextcore serve embed

The model loads once at start-up (an OpenVINO export is cached under
``CONTEXTCORE_KNOWLEDGE_CACHE_DIR``) before the first batch is fetched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import embed_topics
from consumers.knowledge.embed.handler import EmbedHandler
from consumers.knowledge.embed.metrics import EmbedMetrics, TimedEncoder
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.compose import Environment, consumer_app, reply_channel
from consumers.runtime.database import handler_database
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.adapters.store import PostgresChunkStore
from contextcore.knowledge.embed import Embedder
from contextcore.storage.settings import DatabaseSettings
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
    env = Environment.of(kafka, topics, database)
    knowledge = knowledge or KnowledgeSettings()

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[EmbedHandler]:
        async with handler_database(env.database) as db:
            encoders = [
                await asyncio.to_thread(knowledge.load_encoder, model)
                for model in knowledge.models()
            ]
            embed_metrics = EmbedMetrics.create(metrics.registry)
            embedder = Embedder(
                PostgresChunkStore(db.tenants),
                [TimedEncoder(encoder, embed_metrics) for encoder in encoders],
            )
            for model in knowledge.models():  # each model's count starts at 0
                embed_metrics.chunks.labels(model)
            yield EmbedHandler(embedder, embed_metrics, position=db.position)

    return consumer_app(  # the uploaders' addresses are read from their rows
        env,
        name="embed",
        topic=env.topics.embed,
        topics=embed_topics(env.topics),
        settings=embed or EmbedSettings(),
        description=DESCRIPTION,
        payload=EmbedBatchV1,
        publishes=[
            reply_channel(
                "upload-status",
                "ready, on the topic the upload named, once every chunk of its source is stored.",
                UploadStatusV1,
            )
        ],
        open_handler=open_handler,
        dead_letter_causes=("unknown_model",),
    )
