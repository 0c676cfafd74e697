"""Records aimed at a consumer's memory through the width of their JSON (issue 32, item 1), sent
to real consumer processes: a megabyte of ``{}`` as a policy's sources (345,000 of them took a
build consumer from 268 to 1,137 MB: pydantic kept two errors per entry), 16 requests of 15,400
valid refs each (to 449 MB), and requests of 70,000 unknown keys. Each is answered
``invalid_request`` (or refused) with a bounded detail, the valid request behind them is
answered, and the consumer's peak stays under its documented 300 MB.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest

from tests.integration import seed
from tests.integration.helpers import (
    ORG,
    Librdkafka,
    request_message,
    status_mb,
)
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

CONSUMER_MEMORY_MB = 300
"""A build consumer's documented peak (k8s/build-consumer.yaml leaves room above it)."""


def wide_requests(reply_to: str) -> list[tuple[str, bytes]]:
    def request(name: str, **changes: Any) -> tuple[str, bytes]:
        message = request_message(name, reply_to)
        for path, value in changes.items():
            parent = message
            *steps, last = path.split("__")
            for step in steps:
                parent = parent[step]
            parent[last] = value
        return name, json.dumps(message, separators=(",", ":")).encode()

    ref = {"kind": "crm.company", "id": str(uuid.uuid4())}
    out = [request("sources", policy__sources=[{}] * 345_000)]
    out += [request(f"refs-{i}", request__entities=[ref] * 15_400) for i in range(16)]
    out.append(request("keys", **{f"policy__k{i}": i for i in range(70_000)}))
    options = {f"o{i}": i for i in range(70_000)}
    out.append(
        request("options", policy__sources=[{"name": "x", "token_budget": 1, "options": options}])
    )
    out.append(request("sixty-five", policy__sources=[{"name": f"s{i}"} for i in range(65)]))
    out.append(request("refs-1001", request__entities=[ref] * 1_001))
    return out


@pytest.mark.timeout(600)
async def test_wide_build_requests_are_refused_within_the_consumers_memory(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    await seed.insert(admin, "organizations", id=uuid.UUID(ORG), name="Org")
    consumer = await start_consumer(config)
    reply_to = config.reply_topic("wide")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    sent = wide_requests(reply_to)
    try:
        for _, value in sent:
            assert len(value) < 1_048_576  # each is a record a producer of ours could send
            await asyncio.to_thread(client.send, config.request_topic, value, b"k")
        after = json.dumps(request_message("after", reply_to)).encode()
        await asyncio.to_thread(client.send, config.request_topic, after, b"k")
        assert (await asyncio.to_thread(client.reply, "after", 300.0))["status"] == "ok"
        replies = {name: await asyncio.to_thread(client.reply, name) for name, _ in sent}
    finally:
        await asyncio.to_thread(client.close)
    peak = status_mb(consumer.process.pid, "VmHWM")
    print(f"the build consumer's peak: {peak:.0f} MB")
    assert peak < CONSUMER_MEMORY_MB, f"the build consumer peaked at {peak:.0f} MB"
    for name, reply in replies.items():
        assert reply["status"] == "error", name
        assert reply["error"]["code"] == "invalid_request", name
        assert len(reply["error"]["details"]) <= 3, name  # one line per problem, few problems
