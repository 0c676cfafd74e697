"""Briefs that explain themselves, through Kafka (issue 22): a request with ``explain: true`` is
answered with the brief's manifest, and the same request against the same rows gives the same
text, manifest and sha256, again in one consumer process and across two."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import asyncpg
import pytest

from devstack import demo_seed
from devstack.demo import DEMO_REQUEST
from producers.explain import explain
from schemas.build import BuildRequestV1
from schemas.context import (
    BriefManifest,
    ContextBrief,
    ContextPolicy,
)
from tests.integration.helpers import producer, read_json
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

# the demo's sources but knowledge (no encoder in these processes), under a total that binds
POLICY = ContextPolicy.model_validate(
    {
        "total_token_budget": 260,
        "sources": [
            {"name": "conversation", "token_budget": 300},
            {"name": "application", "token_budget": 120},
            {"name": "dossier", "token_budget": 250, "options": {"include_user": True}},
            {"name": "definition_summary", "token_budget": 100},
            {"name": "run_history", "token_budget": 150},
            {"name": "memory", "token_budget": 200},
        ],
    }
)


def request_record(correlation_id: str, reply_to: str) -> bytes:
    envelope = BuildRequestV1(
        correlation_id=correlation_id,
        reply_to=reply_to,
        request=DEMO_REQUEST,
        policy=POLICY,
        explain=True,
    )
    return envelope.model_dump_json().encode()


def exact(reply: dict[str, Any]) -> tuple[str, str]:
    """The brief and the manifest as the bytes the consumer wrote (key order kept)."""
    return json.dumps(reply["brief"]), json.dumps(reply["manifest"])


async def test_the_same_explained_request_gives_the_same_bytes_in_two_processes(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    await demo_seed.seed_demo(admin)
    group = config.build.group_id
    for member in ("a", "b"):  # two groups: each process answers every request
        await start_consumer(config.with_("build", group_id=f"{group}-{member}"))
    replies_topic = config.reply_topic("explained")
    send = await producer(config.bootstrap)
    try:
        for correlation_id in ("first", "second"):
            await send.send_and_wait(
                config.request_topic, request_record(correlation_id, replies_topic)
            )
    finally:
        await send.stop()

    replies = await read_json(config.bootstrap, replies_topic, until=4)
    assert sorted(r["correlation_id"] for r in replies) == ["first", "first", "second", "second"]
    assert all(r["status"] == "ok" for r in replies)
    assert len({exact(reply) for reply in replies}) == 1  # one brief, one manifest, bytewise
    brief, manifest = replies[0]["brief"], replies[0]["manifest"]
    print(explain(ContextBrief(**brief), BriefManifest(**manifest)))  # what --explain shows
    assert manifest["brief_sha256"] == hashlib.sha256(brief["text"].encode()).hexdigest()
    outcomes = {entry["outcome"] for entry in manifest["items"]}
    assert "kept" in outcomes
    assert outcomes - {"kept"}, "the total binds: some item is dropped"
    for source, tokens in brief["per_source_tokens"].items():
        kept = [e for e in manifest["items"] if e["source"] == source and e["outcome"] == "kept"]
        assert sum(e["tokens"] for e in kept) == tokens
    for source, count in brief["dropped"].items():
        lost = [e for e in manifest["items"] if e["source"] == source and e["outcome"] != "kept"]
        assert len(lost) == count


async def test_a_request_without_explain_carries_no_manifest(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    await demo_seed.seed_demo(admin)
    await start_consumer(config)
    replies_topic = config.reply_topic("unexplained")
    plain = json.loads(request_record("plain", replies_topic))
    del plain["explain"]
    send = await producer(config.bootstrap)
    try:
        await send.send_and_wait(config.request_topic, json.dumps(plain).encode())
    finally:
        await send.stop()
    [reply] = await read_json(config.bootstrap, replies_topic, until=1)
    assert reply["status"] == "ok"
    assert reply["brief"]["text"]
    assert reply["manifest"] is None
