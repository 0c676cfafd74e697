"""Plain-aiokafka helpers: the tests talk to the broker without our client where it matters."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ORG = "6f1c2a3b-0000-4000-8000-000000000001"


def request_message(correlation_id: str, reply_to: str, **overrides: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "schema_version": 1,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "request": {"subject": {"organization_id": ORG}, "query": "who is Acme?"},
        "policy": {
            "total_token_budget": 500,
            "sources": [{"name": "application", "token_budget": 200}],
        },
    }
    message.update(overrides)
    return message


async def producer(bootstrap: str) -> AIOKafkaProducer:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await client.start()
    return client


async def read_json(
    bootstrap: str, topic: str, *, until: int, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Read ``topic`` from the beginning until ``until`` records arrived (partition-less)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=f"reader-{uuid.uuid4().hex}",
        auto_offset_reset="earliest", fetch_max_wait_ms=20, enable_auto_commit=False,
    )
    await consumer.start()
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
