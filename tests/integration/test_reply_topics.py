"""A reply goes only to a topic a caller may own (issue 32, item 6), through the real broker and
each consumer as its own process.

An attacker's review found the service writing its replies (briefs with a tenant's data among
them) wherever ``reply_to`` pointed: into request topics, the embedding topic, a dead-letter
topic and ``__consumer_offsets``. Here every request consumer (build, upload, memory) reads
requests, valid and invalid, whose ``reply_to`` names such a topic or one outside the reply
pattern: nothing of theirs is written to that topic (read from its beginning), each one is a
dead letter ``reply_to_refused`` naming the topic, and the valid request behind them is
answered. The addresses a knowledge source row kept from before the rule get nothing either:
neither the sweep nor the embedding group answers on them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from broker.reply_topics import ReplyTopics
from broker.topics import TopicSpec, dead_letter_topic, ensure_topics, memory_topics, upload_topics
from consumers.knowledge.sweep.app import Sweeper, SweepSettings
from consumers.knowledge.sweep.postgres import PostgresSweepStore
from consumers.runtime.kafka import AiokafkaPublisher
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.storage.settings import DatabaseSettings
from schemas.memory import Invoker
from schemas.upload import EmbedBatchV1, EmbedChunkV1
from tests.integration.helpers import (
    Librdkafka,
    read_json,
    remember_message,
    replies_among,
    request_message,
)
from tests.services import Config, Database, StartConsumer

pytestmark = pytest.mark.integration

ORG = uuid.UUID("6f1c2a3b-0000-4000-8000-0000000000e6")
PRINCIPAL = Invoker(
    organization_id=ORG,
    definition_id=uuid.UUID("6f1c2a3b-0000-4000-8000-00000000d0e6"),
    user_id=uuid.UUID("6f1c2a3b-0000-4000-8000-00000000e0e6"),
)


def upload_message(correlation_id: str, reply_to: str) -> dict[str, Any]:
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(ORG),
        "title": "Notes",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://{correlation_id}",
        "content": {"text": "# Notes\n\nRefunds within 30 days."},
    }


def reingest_message(correlation_id: str, reply_to: str) -> dict[str, Any]:
    """A retry of a source that does not exist: answered ``rejected``, when answered."""
    return {
        "action": "reingest",
        "scope": "organization",
        "organization_id": str(ORG),
        "source_id": str(uuid.uuid4()),
        "idempotency_key": f"k-{correlation_id}",
        "correlation_id": correlation_id,
        "reply_to": reply_to,
    }


def memory_message(correlation_id: str, reply_to: str) -> dict[str, Any]:
    return remember_message(correlation_id, reply_to, PRINCIPAL, text=f"fact {correlation_id}")


Message = Callable[[str, str], dict[str, Any]]
CONSUMERS: dict[str, tuple[str, list[Message]]] = {
    # consumer: (its request topic's setting, the requests it reads)
    "build": ("build_request", [request_message]),
    "upload": ("upload", [upload_message, reingest_message]),
    "memory": ("memory_write", [memory_message]),
}
OTHER_REQUEST = {"build": "upload", "upload": "memory_write", "memory": "build_request"}


def forbidden_topics(config: Config, consumer: str) -> dict[str, str]:
    """What the review found written, and a name outside the reply pattern."""
    topics = config.topics
    own = getattr(topics, CONSUMERS[consumer][0])
    return {
        "internal": "__consumer_offsets",
        "own request": own,
        "another request": getattr(topics, OTHER_REQUEST[consumer]),
        "embed": topics.embed,
        "dead letter": dead_letter_topic(own),
        "outside the pattern": topics.reply_prefix.replace(".reply", ".elsewhere"),
    }


@pytest.mark.timeout(400)
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
async def test_a_forbidden_reply_topic_gets_nothing_and_the_request_a_dead_letter(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, consumer: str
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'R')", ORG)
    await ensure_topics(config.bootstrap, [*upload_topics(config.topics)])
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    # one record at a time: once the last request is answered, each one before it is settled
    config = config.with_(consumer, max_in_flight=1)
    setting, messages = CONSUMERS[consumer]
    request_topic = getattr(config.topics, setting)
    forbidden = forbidden_topics(config, consumer)
    await start_consumer(config, consumer=consumer)
    reply_to = config.reply_topic("allowed")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    refused: dict[str, str] = {}  # correlation id -> the topic it named
    run = uuid.uuid4().hex[:8]  # __consumer_offsets is the broker's, shared by every test
    try:
        for name, topic in forbidden.items():
            for index, make in enumerate(messages):
                valid = make(f"{run}-{name}-{index}", topic)
                invalid = {**make(f"{run}-{name}-{index}-invalid", topic), "surprise": True}
                for message in (valid, invalid):
                    refused[message["correlation_id"]] = topic
                    value = json.dumps(message).encode()
                    await asyncio.to_thread(client.send, request_topic, value, b"one")
        after = messages[0]("after", reply_to)
        await asyncio.to_thread(client.send, request_topic, json.dumps(after).encode(), b"one")
        answer = await asyncio.to_thread(client.reply, "after", 120.0)
    finally:
        await asyncio.to_thread(client.close)
    assert answer["correlation_id"] == "after"
    assert answer.get("status") in {"ok", "pending", "written"}

    assert await replies_among(config.bootstrap, forbidden.values(), refused) == []
    letters = await read_json(
        config.bootstrap, dead_letter_topic(request_topic), until=len(refused)
    )
    assert len(letters) == len(refused)
    for letter in letters:
        message = json.loads(letter["payload"])
        topic = refused[message["correlation_id"]]
        assert letter["cause"] == "reply_to_refused", letter
        assert f"'{topic}'" in letter["reason"], letter


# ------------------------------------------- addresses stored before the rule (knowledge rows)


async def pending_source(
    admin: asyncpg.Connection, reply_to: str, correlation_id: str, *, hours_ago: int = 0
) -> uuid.UUID:
    """A pending source of one chunk whose upload named ``reply_to``, as a row written before
    the rule (or under other settings) keeps it."""
    source = uuid.uuid4()
    since = f"now() - interval '{hours_ago} hours'"
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type, status,"
        f" pending_since, upload_key, reply_to, correlation_id) VALUES ($1, $2, 'inline', 'Doc',"
        f" $3, 'text/plain', 'pending', {since}, $4, $5, $6)",
        source,
        ORG,
        f"docs://{source}",
        f"k-{source}",
        reply_to,
        correlation_id,
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status, pending_since)"
        f" VALUES ($1, $2, $3, 1, 1, 0, 'pending', {since})",
        ORG,
        source,
        DEFAULT_MODEL,
    )
    return source


async def test_the_sweep_tells_no_uploader_on_a_forbidden_topic(
    config: Config, admin: asyncpg.Connection, database: Database
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'R')", ORG)
    await ensure_topics(config.bootstrap, [*upload_topics(config.topics)])
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    forbidden = forbidden_topics(config, "upload")
    run = uuid.uuid4().hex[:8]
    refused = {f"{run}-{name}": topic for name, topic in forbidden.items()}
    for correlation_id, topic in refused.items():
        await pending_source(admin, topic, correlation_id, hours_ago=2)
    reply_to = config.reply_topic("swept")
    await ensure_topics(config.bootstrap, [TopicSpec(reply_to, 1)])
    await pending_source(admin, reply_to, f"{run}-allowed", hours_ago=2)
    publisher = AiokafkaPublisher(config.kafka, client_id="test-sweep")
    await publisher.start()
    try:
        sweeper = Sweeper(
            SweepSettings(metrics_port=0),
            PostgresSweepStore(DatabaseSettings.model_construct(url=database.url)),
            publisher,
            reply_topics=ReplyTopics.of(config.topics),
        )
        assert len(await sweeper.sweep_once()) == len(refused) + 1
    finally:
        await publisher.stop()
    [told] = await read_json(config.bootstrap, reply_to, until=1)
    assert (told["correlation_id"], told["status"]) == (f"{run}-allowed", "failed")
    assert await replies_among(config.bootstrap, forbidden.values(), refused) == []


@pytest.mark.timeout(400)  # the embedding consumer loads its model first
async def test_the_embedding_group_answers_no_uploader_on_a_forbidden_topic(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'R')", ORG)
    await ensure_topics(config.bootstrap, [*upload_topics(config.topics)])
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    config = config.with_("embed", max_in_flight=1)  # in order: the last answer settles all
    forbidden = forbidden_topics(config, "upload")
    run = uuid.uuid4().hex[:8]
    refused = {f"{run}-{name}": topic for name, topic in forbidden.items()}
    sources = {await pending_source(admin, topic, cid): topic for cid, topic in refused.items()}
    reply_to = config.reply_topic("ready")
    sources[await pending_source(admin, reply_to, f"{run}-allowed")] = reply_to
    await start_consumer(config, consumer="embed")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    try:
        for source in sources:  # the batch that completes each source
            batch = EmbedBatchV1(
                organization_id=ORG,
                source_id=source,
                generation=1,
                embedding_model=DEFAULT_MODEL,
                chunks=[EmbedChunkV1(ordinal=0, section="Doc", text="Refunds.", tokens=3)],
            )
            value = batch.model_dump_json().encode()
            await asyncio.to_thread(client.send, config.topics.embed, value, b"one")
        told = await asyncio.to_thread(client.reply, f"{run}-allowed", 120.0)
    finally:
        await asyncio.to_thread(client.close)
    assert told["status"] == "ready"
    assert await replies_among(config.bootstrap, forbidden.values(), refused) == []
    letters = await read_json(
        config.bootstrap, dead_letter_topic(config.topics.embed), until=len(refused)
    )
    for letter in letters:
        topic = sources[uuid.UUID(json.loads(letter["payload"])["source_id"])]
        assert letter["cause"] == "reply_to_refused", letter
        assert f"'{topic}'" in letter["reason"], letter
    stored = await admin.fetchval("SELECT count(*) FROM knowledge_chunks")
    assert stored == len(sources)  # the chunks are stored: only the answer is withheld
