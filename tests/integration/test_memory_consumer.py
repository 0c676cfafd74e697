"""The memory consumer through the real broker and PostgreSQL (issue 9): the client's calls are
answered; writers racing through Kafka end in one linear chain; a consumer killed mid-stream
loses no write and applies none twice; fuzzed records never stall a partition."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.topics import dead_letter_topic, ensure_topics, memory_topics
from contextcore.memory.adapters.health import health
from contextcore.storage.tenancy import TenantDatabase
from producers.memory import MemoryClient
from schemas.memory import Invoker, MemoryCandidate
from tests.integration.helpers import Librdkafka, remember_message, settled
from tests.integration.test_poison_records import json_values, text_of
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000a1")
DEFINITION = uuid.UUID("7b000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7b000000-0000-4000-8000-00000000e001")
PRINCIPAL = Invoker(organization_id=ORG, definition_id=DEFINITION, user_id=USER)


@pytest.fixture
async def ready(config: Config, admin: asyncpg.Connection) -> Config:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'M')", ORG)
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    return config


def client(config: Config) -> MemoryClient:
    return MemoryClient(
        bootstrap_servers=config.bootstrap,
        memory_topic=config.topics.memory_write,
        reply_topic_prefix=config.topics.reply_prefix,
        fetch_max_wait_ms=config.kafka.fetch_max_wait_ms,
    )


async def test_the_client_remembers_and_forgets_through_the_consumer(
    ready: Config, start_consumer: StartConsumer
) -> None:
    await start_consumer(ready, consumer="memory")
    async with client(ready) as memory:
        preference = MemoryCandidate(
            scope="user", attribute="preference.language", text="Write in British English"
        )
        first = await memory.remember(PRINCIPAL, preference)
        assert (first.status, first.change) == ("written", "created")
        assert first.memory is not None
        again = await memory.remember(PRINCIPAL, preference)
        assert (again.status, again.reason) == ("refused", "duplicate")
        forgotten = await memory.forget(PRINCIPAL, first.memory.id)
        assert (forgotten.status, forgotten.change) == ("written", "forgotten")
        node = PRINCIPAL.model_copy(update={"workflow_node": True})
        refused = await memory.remember(node, preference)
        assert (refused.status, refused.reason) == ("refused", "workflow_node")


async def test_invalid_input_the_journal_cannot_hold_is_counted_for_health(
    ready: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    tenant_db: TenantDatabase,
) -> None:
    """Issue 19: the health refusal rate left out invalid_input. A record that does not validate
    and a key reused for another call are counted per organization (migration 00028); another
    organization sees none of the counts."""
    other = uuid.uuid4()
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'other')", other)
    await start_consumer(ready, consumer="memory")
    reply_to = ready.reply_topic("memory-unjournaled")
    kafka = await asyncio.to_thread(Librdkafka, ready.bootstrap, reply_to)
    topic = ready.topics.memory_write
    messages = [
        remember_message("first", reply_to, PRINCIPAL, text="the first call"),
        {
            **remember_message("reused", reply_to, PRINCIPAL, text="another call"),
            "idempotency_key": "k-first",
        },
        remember_message("invalid", reply_to, PRINCIPAL, attribute=""),
        remember_message(  # refused by a rule before any read: journaled, counted once
            "owner-kind",
            reply_to,
            PRINCIPAL,
            scope="organization",
            subject_refs=[{"kind": "user", "id": str(USER)}],
        ),
        {**remember_message("no-principal", reply_to, PRINCIPAL), "principal": "nobody"},
    ]
    try:
        for message in messages:
            await asyncio.to_thread(
                kafka.send, topic, json.dumps(message).encode(), str(ORG).encode()
            )
        answers = [await asyncio.to_thread(kafka.reply, m["correlation_id"], 60) for m in messages]
    finally:
        await asyncio.to_thread(kafka.close)
    assert [a.get("reason") for a in answers] == [None] + ["invalid_input"] * 4
    report = await health(tenant_db, ORG, timedelta(days=1))
    # the record with no principal names no organization: only the process-wide metric counts it
    assert report.calls == {"remember created": 1, "remember refused invalid_input": 3}
    assert report.refusal_rate == 3 / 4
    assert (await health(tenant_db, other, timedelta(days=1))).calls == {}


def forget_message(correlation_id: str, reply_to: str, memory_id: str) -> dict[str, Any]:
    message = remember_message(correlation_id, reply_to, PRINCIPAL)
    del message["memory"]
    return {**message, "action": "forget", "memory_id": memory_id}


RACES = {
    "remember against remember": {("superseded", "superseded")},
    "forget against remember": {("forgotten", "revived"), ("superseded", "not_live")},
    "forget against forget": {("forgotten", "not_live")},
}
"""Each round's two calls, and the answers they may get in either order of commit."""


@pytest.mark.timeout(300)
async def test_writers_racing_through_kafka_end_in_one_linear_chain(
    ready: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """Two memory consumers, each with a partition; each round sends two calls on one chain
    together, one to each partition, so that two processes apply them in overlapping
    transactions. With ``memories_one_child`` dropped, rounds fork the chain (issue 19)."""
    await start_consumer(ready, consumer="memory")
    await start_consumer(ready, consumer="memory")
    reply_to = ready.reply_topic("memory-race")
    kafka = await asyncio.to_thread(Librdkafka, ready.bootstrap, reply_to)
    topic = ready.topics.memory_write
    key = f"user:{USER}:observation.stage"
    head_of_chain = (
        "SELECT id, forgotten_at IS NULL AS live FROM memory_heads WHERE subject_key = $1"
    )

    async def call(message: dict[str, Any]) -> dict[str, Any]:
        await asyncio.to_thread(kafka.send, topic, json.dumps(message).encode(), str(ORG).encode())
        return await asyncio.to_thread(kafka.reply, message["correlation_id"], 60)

    rounds: Counter[str] = Counter()
    try:
        await call(remember_message("seed", reply_to, PRINCIPAL, attribute="observation.stage"))
        for number in range(36):
            race = list(RACES)[number % len(RACES)]
            head = await admin.fetchrow(head_of_chain, key)
            assert head is not None
            if not head["live"]:  # forgets need a live head
                text = {"text": f"again {number}", "attribute": "observation.stage"}
                await call(remember_message(f"live-{number}", reply_to, PRINCIPAL, **text))
                head = await admin.fetchrow(head_of_chain, key)
                assert head is not None
            pair = []
            for side in ("a", "b"):
                name = f"{number}{side}"
                if race.startswith("forget") and (side == "a" or race.endswith("forget")):
                    pair.append(forget_message(name, reply_to, str(head["id"])))
                else:
                    text = {"text": f"stage {name}", "attribute": "observation.stage"}
                    pair.append(remember_message(name, reply_to, PRINCIPAL, **text))
            await asyncio.to_thread(
                kafka.send_together,
                [(topic, json.dumps(m).encode(), p) for p, m in enumerate(pair)],
            )
            answers = [await asyncio.to_thread(kafka.reply, m["correlation_id"], 60) for m in pair]
            got = tuple(sorted(a.get("change") or a.get("reason") or "" for a in answers))
            assert got in {tuple(sorted(o)) for o in RACES[race]}, (race, answers)
            rounds[race] += 1
    finally:
        await asyncio.to_thread(kafka.close)
    assert set(rounds.values()) == {12}
    rows = await admin.fetch("SELECT id, supersedes_id FROM memories WHERE subject_key = $1", key)
    parents = [r["supersedes_id"] for r in rows if r["supersedes_id"] is not None]
    assert len(parents) == len(set(parents)) == len(rows) - 1  # one root, one child each
    assert (
        await admin.fetchval("SELECT count(*) FROM memory_heads WHERE subject_key = $1", key) == 1
    )


@pytest.mark.timeout(300)
async def test_a_consumer_killed_mid_stream_loses_no_write_and_applies_none_twice(
    ready: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    reply_to = ready.reply_topic("memory-kill")
    kafka = await asyncio.to_thread(Librdkafka, ready.bootstrap, reply_to)
    total = 300
    try:
        for i in range(total):
            message = remember_message(
                f"w{i}", reply_to, PRINCIPAL, attribute=f"observation.fact_{i}"
            )
            await asyncio.to_thread(
                kafka.send,
                ready.topics.memory_write,
                json.dumps(message).encode(),
                str(ORG).encode(),
            )
        first = await start_consumer(ready, consumer="memory")
        async with asyncio.timeout(60):
            while True:  # kill it a fifth of the way in, with writes in flight
                if await admin.fetchval("SELECT count(*) FROM memories") >= total // 5:
                    break
                await asyncio.sleep(0.01)
        await first.stop(signal.SIGKILL)
        killed_at = await admin.fetchval("SELECT count(*) FROM memories")
        await start_consumer(ready, consumer="memory")
        answers = [await asyncio.to_thread(kafka.reply, f"w{i}", 60) for i in range(total)]
    finally:
        await asyncio.to_thread(kafka.close)
    assert killed_at < total, "the consumer finished before it was killed: nothing was tested"
    assert {a["status"] for a in answers} == {"written"}
    assert await admin.fetchval("SELECT count(*) FROM memories") == total
    assert await admin.fetchval("SELECT count(DISTINCT subject_key) FROM memories") == total
    journal = await admin.fetchval("SELECT count(*) FROM memory_writes WHERE outcome = 'created'")
    assert journal == total


TARGETS = [
    ("correlation_id",),
    ("action",),
    ("idempotency_key",),
    ("principal",),
    ("principal", "organization_id"),
    ("principal", "user_id"),
    ("principal", "workflow_node"),
    ("memory",),
    ("memory", "scope"),
    ("memory", "attribute"),
    ("memory", "text"),
    ("memory", "subject_refs"),
]


@st.composite
def poison_write(draw: st.DrawFn, reply_to: str, correlation_id: str) -> bytes:
    kind = draw(
        st.sampled_from(["bytes", "oversize", "value", "huge", "deep", "surrogate", "nul", "ref"])
    )
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=2_000))
    if kind == "oversize":
        return draw(st.sampled_from([b"{", b"[", b"\xff"])) * draw(st.integers(300_000, 990_000))
    message = remember_message(correlation_id, reply_to, PRINCIPAL)
    if kind == "ref":  # a ref the model makes up: blank, colons, NUL, surrogates, numbers
        part = st.text(alphabet=st.sampled_from([" ", "\t", "\u00a0", ":", "\x00", "a", "\ud800"]))
        message["memory"]["subject_refs"] = [
            {"kind": draw(part | json_values), "id": draw(part | json_values)}
        ]
        return json.dumps(message).encode()
    path = draw(st.sampled_from(TARGETS))
    parent = message
    for step in path[:-1]:
        parent = parent[step]
    raw: dict[str, str] = {}
    if kind == "value" and path == ("correlation_id",):
        # a string here may be a valid id, answered under another name: keep it invalid
        parent[path[-1]] = draw(st.none() | st.integers() | st.lists(st.booleans(), max_size=2))
    elif kind == "value":
        parent[path[-1]] = draw(json_values)
    elif kind == "huge":
        parent[path[-1]] = "@raw@"
        raw["raw"] = "9" * draw(st.integers(19, 6_000))
    elif kind == "deep":
        depth = draw(st.integers(60, 2_000))
        parent[path[-1]] = "@raw@"
        raw["raw"] = "[" * depth + "1" + "]" * depth
    elif kind == "surrogate":
        parent[path[-1]] = "a\udbff"
    else:
        parent[path[-1]] = "\x00" * draw(st.integers(1, 3))
    return text_of(message, **raw)


@pytest.mark.timeout(600)
async def test_fuzzed_memory_writes_never_stall_a_partition_and_each_one_is_settled(
    ready: Config, start_consumer: StartConsumer
) -> None:
    consumer = await start_consumer(ready, consumer="memory")
    reply_to = ready.reply_topic("memory-fuzz")
    kafka = await asyncio.to_thread(Librdkafka, ready.bootstrap, reply_to)
    sent: dict[str, tuple[int, int]] = {}

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        correlation_id = f"fuzz-{len(sent)}"
        value = data.draw(poison_write(reply_to, correlation_id))
        key = data.draw(st.sampled_from([str(ORG).encode(), b"other"]))
        sent[correlation_id] = kafka.send(ready.topics.memory_write, value, key)
        after = f"after-{correlation_id}"
        valid = json.dumps(
            remember_message(after, reply_to, PRINCIPAL, attribute=f"observation.after_{len(sent)}")
        ).encode()
        kafka.send(ready.topics.memory_write, valid, key)
        assert kafka.reply(after)["status"] == "written"

    try:
        await asyncio.to_thread(fuzz)
        answered, letters = await settled(
            kafka, ready.bootstrap, dead_letter_topic(ready.topics.memory_write), sent
        )
    finally:
        await asyncio.to_thread(kafka.close)
    assert consumer.process.returncode is None
    assert not {letter["cause"] for letter in letters} & {"gave_up", "retry_refused"}
    for cid in answered:
        assert kafka.replies[cid]["status"] in {"written", "refused"}
    assert "Traceback" not in consumer.log()


async def memory_command(config: Config, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "producers.command",
        "memory",
        *args,
        env=config.environ(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return await process.wait(), out.decode()


async def test_the_cli_remembers_refuses_forgets_and_reports_health(
    ready: Config, start_consumer: StartConsumer
) -> None:
    await start_consumer(ready, consumer="memory")
    who = ["--organization", str(ORG), "--definition", str(DEFINITION), "--user", str(USER)]
    fact = ["--scope", "user", "--attribute", "preference.tone", "--text", "Be brief"]
    code, out = await memory_command(ready, "remember", *who, *fact)
    assert code == 0, out
    memory_id = json.loads(out)["memory"]["id"]
    code, out = await memory_command(ready, "remember", *who, *fact)
    assert code == 1, out
    assert '"reason": "duplicate"' in out
    code, out = await memory_command(ready, "remember", *who, *fact[:4], "--text", "Be thorough")
    assert code == 0, out
    code, out = await memory_command(ready, "forget", *who, memory_id)
    assert code == 1, out  # the first revision is no longer the live one
    assert '"reason": "not_live"' in out
    code, out = await memory_command(ready, "health", "--organization", str(ORG))
    assert code == 0, out
    assert "chains: 1, live: 1" in out
    assert "chain lengths: 2 revisions: 1" in out
    assert "remember refused duplicate: 1" in out
    assert "forget refused not_live: 1" in out
    assert "refusal rate: 50.0%" in out
