"""A Node service round-tripping every topic (issue 35): clients/node/roundtrip.mjs, through the
TypeScript client (clients/typescript/, on kafkajs, a client nobody here wrote), remembers and
forgets a memory, gets briefs that reflect both, a BuildFailed for a policy refused, an
invalid_request reply to a malformed request sent raw, and an upload's ``ready``, validating
every reply against docs/schemas/ with ajv. It runs against this test's topics and consumers,
on the same broker and database as every other."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest

from broker.topics import ensure_topics, memory_topics, upload_topics
from tests.integration import seed
from tests.services import Config, StartConsumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
SCRIPT_TIMEOUT_S = 240.0


async def test_a_node_service_round_trips_every_topic_and_every_reply_validates(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    node = shutil.which("node")
    assert node is not None, "node (>= 20) is on the PATH: scripts/bootstrap requires it"
    assert (NODE_DIR / "node_modules" / "kafkajs").is_dir(), "scripts/bootstrap runs npm ci"
    built = NODE_DIR.parent / "typescript" / "dist" / "index.js"
    assert built.is_file(), "scripts/test builds the TypeScript client (npm run build there)"
    await ensure_topics(
        config.bootstrap, [*memory_topics(config.topics), *upload_topics(config.topics)]
    )
    organization = await seed.organization(admin)
    await asyncio.gather(
        *(start_consumer(config, consumer=c) for c in ("build", "memory", "upload", "embed"))
    )
    env = {
        **os.environ,
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": config.bootstrap,
        "CONTEXTCORE_TOPIC_BUILD_REQUEST": config.topics.build_request,
        "CONTEXTCORE_TOPIC_UPLOAD": config.topics.upload,
        "CONTEXTCORE_TOPIC_MEMORY_WRITE": config.topics.memory_write,
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": config.topics.reply_prefix,
        "CONTEXTCORE_NODE_ORGANIZATION": str(organization),
    }
    process = await asyncio.create_subprocess_exec(
        node,
        str(NODE_DIR / "roundtrip.mjs"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), SCRIPT_TIMEOUT_S)
    finally:
        if process.returncode is None:  # timed out, or this test was cancelled
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"the Node service failed:\n{err.decode()}\n{out.decode()}"
    summary = json.loads(out.decode().strip().splitlines()[-1])
    print(f"Node service (kafkajs): {summary}")
    assert summary["sent_validated"] == [
        "build-request",
        "memory-forget",
        "memory-remember",
        "upload-request",
    ]
    # what it was told, as the database holds it: the memory's chain ends in a tombstone, and
    # the document is ready with its chunks
    chain = await admin.fetch(
        "SELECT text, forgotten_at FROM memories WHERE organization_id = $1 ORDER BY created_at",
        organization,
    )
    assert [(r["text"], r["forgotten_at"] is not None) for r in chain] == [
        ("Answers in Welsh", False),
        (None, True),
    ]
    source = await admin.fetchrow(
        "SELECT s.status, count(c.id) AS chunks FROM knowledge_sources s"
        " LEFT JOIN knowledge_chunks c ON c.source_id = s.id WHERE s.id = $1 GROUP BY s.status",
        uuid.UUID(summary["source_id"]),
    )
    assert source is not None
    assert source["status"] == "ready"
    assert source["chunks"] >= 1
