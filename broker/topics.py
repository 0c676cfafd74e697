"""The topics contextcore owns, their partition counts, and an idempotent ``ensure_topics``.

Consumers call :func:`ensure_topics` at start-up too: Tansu's default memory storage forgets
topics when it restarts, and a production cluster with auto-creation off needs them made once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from broker.settings import TopicSettings
from schemas.errors import ConfigurationError, InfrastructureUnavailable


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    """Topic configs set when the topic is created (an existing topic keeps its own)."""


MEMORY_WRITE_CONFIGS = {"retention.ms": "172800000", "segment.ms": "86400000"}
"""The memory-write topic holds memory text, which an erasure cannot reach: each record leaves
within 3 days (2 days' retention, checked once its 1-day segment has rolled). A record is
consumed in seconds; 2 days covers a weekend's outage of the memory consumer."""
MEMORY_DEAD_LETTER_CONFIGS = {"retention.ms": "518400000", "segment.ms": "86400000"}
"""The memory-write dead letters: within 7 days (6 days' retention, 1-day segments)."""


def dead_letter_topic(topic: str) -> str:
    """The dead-letter topic of ``topic``: records that could not be answered go there."""
    return f"{topic}.dlt"


def build_topics(topics: TopicSettings) -> list[TopicSpec]:
    """The build-request topic and its dead-letter topic."""
    request = topics.build_request
    return [
        TopicSpec(request, topics.build_request_partitions),
        TopicSpec(dead_letter_topic(request), 1),
    ]


def upload_topics(topics: TopicSettings) -> list[TopicSpec]:
    """The upload topic, the embedding topic it feeds, and their dead-letter topics."""
    return [
        TopicSpec(topics.upload, topics.upload_partitions),
        TopicSpec(dead_letter_topic(topics.upload), 1),
        *embed_topics(topics),
    ]


def embed_topics(topics: TopicSettings) -> list[TopicSpec]:
    return [
        TopicSpec(topics.embed, topics.embed_partitions),
        TopicSpec(dead_letter_topic(topics.embed), 1),
    ]


def memory_topics(topics: TopicSettings) -> list[TopicSpec]:
    """The memory-write topic and its dead-letter topic."""
    return [
        TopicSpec(topics.memory_write, topics.memory_write_partitions, MEMORY_WRITE_CONFIGS),
        TopicSpec(dead_letter_topic(topics.memory_write), 1, MEMORY_DEAD_LETTER_CONFIGS),
    ]


def all_topics(topics: TopicSettings) -> list[TopicSpec]:
    """Every topic contextcore's consumers read or write (reply topics belong to clients)."""
    return [*build_topics(topics), *upload_topics(topics), *memory_topics(topics)]


async def reach(start: Awaitable[None], bootstrap_servers: str, timeout_s: float) -> None:
    """Await a Kafka client's ``start()``.

    Raises:
        InfrastructureUnavailable: the broker did not answer within ``timeout_s`` (one line;
            the caller closes its client).
    """
    try:
        await asyncio.wait_for(start, timeout_s)
    except (TimeoutError, KafkaConnectionError, OSError) as error:
        raise InfrastructureUnavailable(
            f"cannot reach the Kafka broker at {bootstrap_servers}: {error or 'timed out'}"
        ) from error


async def ensure_topics(
    bootstrap_servers: str,
    topics: list[TopicSpec],
    *,
    timeout_s: float = 10.0,
    create: bool = True,
    replication_factor: int = 1,
) -> list[str]:
    """Create each missing topic; returns the names created (existing ones are left as they are).

    Raises:
        InfrastructureUnavailable: the broker did not answer within ``timeout_s``.
        ConfigurationError: a topic is missing and ``create`` is off.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000)
    )
    with _quiet("aiokafka"):  # the one-line error below says it all; no log line per attempt
        try:
            await reach(admin.start(), bootstrap_servers, timeout_s)
        except InfrastructureUnavailable:
            await admin.close()
            raise
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        if missing and not create:
            raise ConfigurationError(
                f"topics missing on {bootstrap_servers}: {', '.join(t.name for t in missing)}; "
                "create them (k8s/kafka-topics.yaml) or set CONTEXTCORE_KAFKA_CREATE_TOPICS=true"
            )
        created: list[str] = []
        for topic in missing:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            topic.name,
                            num_partitions=topic.partitions,
                            replication_factor=replication_factor,
                            topic_configs=dict(topic.configs),
                        )
                    ]
                )
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass  # another process created it between list and create
        return created
    except KafkaError as error:
        raise InfrastructureUnavailable(f"broker {bootstrap_servers} refused: {error}") from error
    finally:
        await admin.close()


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def delete_topics(bootstrap_servers: str, names: list[str]) -> None:
    """Best-effort delete (ephemeral reply topics); errors are swallowed on purpose."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        await admin.start()
        await admin.delete_topics(names)
    except (KafkaError, OSError):
        pass
    finally:
        await admin.close()
