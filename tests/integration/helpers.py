"""Plain-aiokafka helpers: the tests talk to the broker without our client where it matters."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from broker.topics import TopicSpec, ensure_topics

ORG = "6f1c2a3b-0000-4000-8000-000000000001"


def request_message(correlation_id: str, reply_to: str, **overrides: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "schema_version": 1,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "request": {
            "subject": {
                "organization_id": ORG,
                "user_id": None,
                "trigger_id": None,
                "definition_id": None,
            },
            "query": "who is Acme?",
            "entities": [],
        },
        "policy": {
            "total_token_budget": 500,
            "sources": [],  # the consumer registers no source yet: an empty, admitted policy
        },
    }
    message.update(overrides)
    return message


async def producer(bootstrap: str) -> AIOKafkaProducer:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await client.start()
    return client


async def assigned_reader(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    """A group-less consumer of every partition of ``topic`` from the beginning.

    No group means no join (3-5 s on Tansu); the topic is created first when missing.
    """
    await ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=20,
        enable_auto_commit=False,
    )
    await consumer.start()
    await consumer.topics()  # refreshes the metadata partitions_for_topic reads
    partitions = consumer.partitions_for_topic(topic) or {0}
    consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
    return consumer


async def read_json(
    bootstrap: str, topic: str, *, until: int, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Read ``topic`` from the beginning until ``until`` records arrived."""
    consumer = await assigned_reader(bootstrap, topic)
    records: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < until:
                batch = await consumer.getmany(timeout_ms=200)
                for messages in batch.values():
                    records.extend(json.loads(m.value) for m in messages)
    finally:
        await consumer.stop()
    return records


def free_port() -> int:
    """A port nothing listens on right now (for a metrics endpoint or a spare stack)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
