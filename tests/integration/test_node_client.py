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
import random
import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest

from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
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


CONFORMANCE = """
import { replyTopicRefusal } from "../typescript/dist/reply-topics.js";
const { cases, prefix, own } = JSON.parse(await new Promise((resolve) => {
  let text = "";
  process.stdin.on("data", (c) => (text += c));
  process.stdin.on("end", () => resolve(text));
}));
const answers = cases.map(([topic, pattern]) =>
  replyTopicRefusal(topic, { prefix, pattern: pattern ?? undefined, own }) === null);
process.stdout.write(JSON.stringify(answers));
"""


async def test_the_typescript_client_refuses_the_reply_topics_the_service_refuses() -> None:
    """clients/typescript/src/reply-topics.ts is broker/reply_topics.py's rule: on the same
    names and patterns (the Python tests' forbidden names, names under the prefix and random
    ones), both take and refuse the same."""
    node = shutil.which("node")
    assert node is not None
    assert (NODE_DIR.parent / "typescript" / "dist" / "reply-topics.js").is_file()
    own = ["t.build-request", "t.upload", "t.memory-write", "t.embed"]
    names = [
        "__consumer_offsets", *own, *(f"{t}.dlt" for t in own), "t.reply.someone.dlt",
        "t.reply", "t.reply.", "t.replyx.a", "elsewhere", "contextcore.reply.a", ".", "..",
        "t.reply.ok", "t.reply.a-b_c.d", "t.reply." + "x" * 241, "t.reply." + "x" * 242,
        "t.reply.a b", "t.reply.é", "",
    ]  # fmt: skip
    alphabet = "abt._-__.dltreplyAZ09 é"
    rng = random.Random(35)
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(300)]
    names += [f"t.reply.{name}" for name in names[-100:]]
    patterns = [None, ".*", r"t\..*", r"[a-z0-9._]+", r"t\.reply\..*|__.*|t\.embed.*"]
    cases = [(name, pattern) for pattern in patterns for name in names]
    script = NODE_DIR / f".conformance-{uuid.uuid4().hex}.mjs"
    script.write_text(CONFORMANCE)
    try:
        process = await asyncio.create_subprocess_exec(
            node, str(script), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        payload = json.dumps({"cases": cases, "prefix": "t.reply", "own": own}).encode()
        out, err = await asyncio.wait_for(process.communicate(payload), 60)
    finally:
        script.unlink()
    assert process.returncode == 0, err.decode()
    typescript = json.loads(out)
    for (name, pattern), takes in zip(cases, typescript, strict=True):
        topics = TopicSettings.model_construct(
            build_request=own[0], upload=own[1], memory_write=own[2], embed=own[3],
            reply_prefix="t.reply", reply_pattern=pattern,
        )  # fmt: skip
        python = ReplyTopics.of(topics).refusal(name) is None
        assert takes == python, (name, pattern, takes, python)
