"""The walking skeleton end to end: real broker, real Postgres, a real consumer process."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
import uuid

import asyncpg
import pytest

from admin.quotas import set_quotas
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.upload.settings import UploadSettings
from tests.integration import seed
from tests.integration.helpers import (
    ORG,
    free_port,
    producer,
    read_json,
    request_message,
)
from tests.services import Config, Database, StartConsumer

pytestmark = pytest.mark.integration


async def test_a_nul_in_the_query_is_refused_at_the_edge_not_by_postgresql(
    config: Config, start_consumer: StartConsumer
) -> None:
    """Issue 17, item 5: PostgreSQL refuses 0x00 in text; the knowledge source used to send the
    query there and fail (``required_source_failed``). The request itself is invalid."""
    reply_topic = config.reply_topic("nul-query")
    await start_consumer(config)
    message = request_message("corr-nul", reply_topic)
    message["request"]["query"] = "refunds\u0000 after 30 days?"
    message["policy"] = {
        "total_token_budget": 500,
        "sources": [
            {
                "name": "knowledge",
                "token_budget": 500,
                "required": True,
                "options": {"include_organization": True, "include_platform": True},
            }
        ],
    }
    send = await producer(config.bootstrap)
    try:
        await send.send_and_wait(config.request_topic, json.dumps(message).encode())
    finally:
        await send.stop()

    [reply] = await read_json(config.bootstrap, reply_topic, until=1)
    assert (reply["correlation_id"], reply["status"]) == ("corr-nul", "error")
    assert reply["error"]["code"] == "invalid_request"
    assert reply["error"]["details"] == ["request.query: Value error, holds a NUL byte"]


async def test_source_failures_reach_the_reply_through_kafka(
    config: Config, start_consumer: StartConsumer
) -> None:
    """A timeout far below a real read makes every source fail: optional ones are named in the
    brief, a required one fails the request with every failed required source named."""
    bootstrap = config.bootstrap
    reply_topic = config.reply_topic("failures")
    settings = config.with_("build", source_timeout_s=1e-6, metrics_port=free_port())
    await start_consumer(settings)
    optional = request_message(
        "corr-optional",
        reply_topic,
        policy={
            "total_token_budget": 100,
            "sources": [
                {"name": "dossier", "token_budget": 50},
                {"name": "definition_summary", "token_budget": 50},
            ],
        },
    )
    required = request_message(
        "corr-required",
        reply_topic,
        policy={
            "total_token_budget": 100,
            "sources": [
                {"name": "dossier", "token_budget": 50, "required": True},
                {"name": "definition_summary", "token_budget": 50},
                {"name": "run_history", "token_budget": 50, "required": True},
            ],
        },
    )
    # with a user, run_history has something to read (with nothing to select it reads nothing)
    required["request"]["subject"]["user_id"] = "6f1c2a3b-0000-4000-8000-0000000000aa"
    send = await producer(bootstrap)
    try:
        for message in (optional, required):
            await send.send_and_wait(
                config.request_topic,
                json.dumps(message).encode(),
                key=b"same-partition",
            )
    finally:
        await send.stop()

    replies = await read_json(bootstrap, reply_topic, until=2)
    # many records are in flight at once: replies come in the order the builds finish
    first, second = sorted(replies, key=lambda reply: reply["correlation_id"] != "corr-optional")
    assert first["correlation_id"] == "corr-optional"
    assert first["status"] == "ok"
    assert first["brief"]["failed_sources"] == ["dossier", "definition_summary"]
    assert first["brief"]["text"].startswith("Unavailable sources")
    assert second["correlation_id"] == "corr-required"
    assert second["error"]["code"] == "required_source_failed"
    assert second["error"]["details"] == ["dossier: timed out", "run_history: timed out"]
    url = f"http://127.0.0.1:{settings.build.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    failures = 'contextcore_source_failures_total{cause="timeout",required="%s",source="%s"} 1.0'
    assert failures % ("false", "dossier") in body
    assert failures % ("true", "run_history") in body
    # every read is timed, a timed-out one too
    assert 'contextcore_source_read_seconds_count{source="dossier"} 2.0' in body
    assert 'contextcore_source_read_seconds_count{source="run_history"} 1.0' in body
    # the caches' hits and misses (both dossier reads missed, and stored nothing) and the
    # database round trips are in /metrics
    cache = 'contextcore_source_cache_requests_total{cache="%s",outcome="%s"} %s'
    assert cache % ("dossier", "miss", "2.0") in body
    assert cache % ("definition_summary", "hit", "0.0") in body
    assert 'contextcore_source_cache_entries{cache="query_vectors"} 0.0' in body
    assert "\ncontextcore_database_round_trips_total " in body


async def test_sources_read_the_replica_when_one_is_configured(
    config: Config, start_consumer: StartConsumer, second_database: Database
) -> None:
    """CONTEXTCORE_DATABASE_READ_URL: every source read goes there (the schema check and the
    dossier listener stay on the primary). The stand-in replica holds a row the primary lacks."""
    bootstrap = config.bootstrap
    reply_topic = config.reply_topic("replica")
    org, company = uuid.uuid4(), uuid.uuid4()
    replica = await asyncpg.connect(second_database.admin_url)
    try:
        await seed.insert(replica, "organizations", id=org, name="Org")
        await seed.insert(
            replica, "crm_companies", organization_id=org, id=company, name="Only on the replica"
        )
    finally:
        await replica.close()
    await start_consumer(config.with_("database", read_url=second_database.url))
    message = request_message(
        "corr-replica",
        reply_topic,
        policy={
            "total_token_budget": 200,
            "sources": [{"name": "application", "token_budget": 200}],
        },
    )
    message["request"]["subject"]["organization_id"] = str(org)
    message["request"]["entities"] = [{"kind": "crm.company", "id": str(company)}]
    send = await producer(bootstrap)
    try:
        await send.send_and_wait(config.request_topic, json.dumps(message).encode())
    finally:
        await send.stop()

    [reply] = await read_json(bootstrap, reply_topic, until=1)
    assert reply["status"] == "ok"
    assert f"[crm.company:{company}] name: Only on the replica" in reply["brief"]["text"]


async def test_an_organization_over_its_rate_is_answered_throttled_and_another_is_not(
    config: Config, start_consumer: StartConsumer, database: Database, admin: asyncpg.Connection
) -> None:
    """Issue 33: with the quota build_rate set for A (organization_quotas, 00038), A's requests
    beyond its burst are answered at once ``throttled``, naming the quota, with how long to
    wait, and counted under A in /metrics; B's requests, in the same partition behind A's
    flood, are built. Without the quota every one is built."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", uuid.UUID(ORG))
    owner = await asyncpg.connect(database.owner_url)
    try:
        await set_quotas(owner, uuid.UUID(ORG), build_rate=0.001, build_burst=3)
    finally:
        await owner.close()
    reply_topic = config.reply_topic("throttled")
    settings = config.with_("build", metrics_port=free_port())
    await start_consumer(settings)
    other = "7c000000-0000-4000-8000-0000000000b2"
    messages = [request_message(f"corr-a{i}", reply_topic) for i in range(8)]
    for i in range(2):
        message = request_message(f"corr-b{i}", reply_topic)
        message["request"]["subject"]["organization_id"] = other
        messages.append(message)
    send = await producer(config.bootstrap)
    try:
        for message in messages:
            await send.send_and_wait(
                config.request_topic, json.dumps(message).encode(), key=b"same-partition"
            )
    finally:
        await send.stop()

    replies = {
        r["correlation_id"]: r for r in await read_json(config.bootstrap, reply_topic, until=10)
    }
    throttled = sorted(c for c, r in replies.items() if r["status"] == "error")
    assert len(throttled) == 5, replies
    assert all(c.startswith("corr-a") for c in throttled)
    for correlation_id in throttled:
        error = replies[correlation_id]["error"]
        assert error["code"] == "throttled"
        assert error["retry_after_ms"] > 0
        assert "try again in" in error["message"]
        assert "quota build_rate" in error["message"]
    assert [replies[f"corr-b{i}"]["status"] for i in range(2)] == ["ok", "ok"]
    url = f"http://127.0.0.1:{settings.build.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert f'contextcore_build_throttled_total{{organization="{ORG}"}} 5.0' in body


def niceness(pid: int) -> int:
    """The nice value of a process (field 19 of /proc/<pid>/stat, after the command's
    parenthesis)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


def policies(pid: int) -> set[int]:
    """The scheduling policies of every thread of a process (the threads and processes it
    starts later inherit its own: the kernel's rule)."""
    return {os.sched_getscheduler(int(thread)) for thread in os.listdir(f"/proc/{pid}/task")}


async def test_the_upload_consumer_yields_the_cpu_and_the_build_consumer_does_not(
    config: Config, start_consumer: StartConsumer
) -> None:
    """Issue 33: batch work runs at a lower CPU priority (nice 10 and SCHED_IDLE by default)
    than the interactive path, so on a shared node extraction and encoding yield the cores to
    builds. (The suite's own config runs them at normal priority: tests/services.py.)"""
    assert UploadSettings.model_fields["nice"].default == 10
    assert EmbedSettings.model_fields["nice"].default == 10
    assert BuildSettings.model_fields["nice"].default == 0
    assert UploadSettings.model_fields["cpu_policy"].default == "idle"
    assert EmbedSettings.model_fields["cpu_policy"].default == "idle"
    assert BuildSettings.model_fields["cpu_policy"].default == "normal"
    ours = niceness(os.getpid())
    build = await start_consumer(config)
    upload = await start_consumer(
        config.with_("upload", nice=10, cpu_policy="idle"), consumer="upload"
    )
    assert niceness(build.process.pid) == ours
    assert niceness(upload.process.pid) == min(ours + 10, 19)
    assert policies(build.process.pid) == {os.sched_getscheduler(0)}
    assert policies(upload.process.pid) == {os.SCHED_IDLE}
