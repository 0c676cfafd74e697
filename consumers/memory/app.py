"""The memory consumer's application.

    contextcore serve memory

Its own group on the memory-write topic: each ``memory.remember`` / ``memory.forget`` call is
applied through :class:`~contextcore.memory.service.MemoryService` and answered on its reply
topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import memory_topics
from consumers.memory.handler import MemoryHandler
from consumers.memory.metrics import MemoryMetrics
from consumers.memory.settings import MemorySettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from consumers.runtime.database import verified_pool
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService
from contextcore.settings import DatabaseSettings
from contextcore.storage.positions import write_position
from contextcore.storage.tenancy import TenantDatabase
from schemas.memory import MemoryAnswerV1, MemoryWriteV1

DESCRIPTION = (
    "Agent memory writes: memory.remember and memory.forget calls of an agent definition. Each "
    "is answered on its reply_to with its correlation_id: written (the new revision and what it "
    "changed) or refused (a machine-readable reason). The same idempotency key twice is "
    "answered the same and writes one row."
)


def create_app(
    memory: MemorySettings | None = None,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    database: DatabaseSettings | None = None,
) -> ConsumerApp:
    memory = memory or MemorySettings()
    kafka = kafka or KafkaSettings()
    topics = topics or TopicSettings()
    database = database or DatabaseSettings()
    reply_topics = ReplyTopics.of(topics)

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[MemoryHandler]:
        async with verified_pool(database) as pool:
            service = MemoryService(PostgresMemoryJournal(TenantDatabase(pool, role=database.role)))
            yield MemoryHandler(
                service,
                MemoryMetrics.create(metrics.registry),
                reply_topics=reply_topics,
                position=partial(write_position, pool),
            )

    return ConsumerApp(
        name="memory",
        topic=topics.memory_write,
        description=DESCRIPTION,
        payload=MemoryWriteV1,
        publishes=[
            Channel(
                "{reply_to}",
                "memory-answer",
                "The answer to one memory write, on the topic the call named, with its "
                "correlation_id.",
                MemoryAnswerV1,
            )
        ],
        settings=memory,
        kafka=kafka,
        database=database,
        topics=memory_topics(topics),
        reply_topics=reply_topics,
        open_handler=open_handler,
        retry_causes=("contention",),
    )
