"""The memory consumer's application.

    contextcore serve memory

Its own group on the memory-write topic: each ``memory.remember`` / ``memory.forget`` call is
applied through :class:`~contextcore.memory.service.MemoryService` and answered on its reply
topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import memory_topics
from consumers.memory.handler import MemoryHandler
from consumers.memory.metrics import MemoryMetrics
from consumers.memory.settings import MemorySettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.compose import Environment, consumer_app, reply_channel
from consumers.runtime.database import handler_database
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService
from contextcore.storage.settings import DatabaseSettings
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
    env = Environment.of(kafka, topics, database)

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, _publisher: Publisher
    ) -> AsyncIterator[MemoryHandler]:
        async with handler_database(env.database) as db:
            yield MemoryHandler(
                MemoryService(PostgresMemoryJournal(db.tenants)),
                MemoryMetrics.create(metrics.registry),
                reply_topics=env.reply_topics,
                position=db.position,
            )

    return consumer_app(
        env,
        name="memory",
        topic=env.topics.memory_write,
        topics=memory_topics(env.topics),
        settings=memory or MemorySettings(),
        description=DESCRIPTION,
        payload=MemoryWriteV1,
        publishes=[
            reply_channel(
                "memory-answer",
                "The answer to one memory write, on the topic the call named, with its "
                "correlation_id.",
                MemoryAnswerV1,
            )
        ],
        open_handler=open_handler,
        retry_causes=("contention",),
    )
