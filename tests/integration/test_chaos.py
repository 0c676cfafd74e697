"""Chaos on every topic (issue 17): uniquely identified build requests, memory writes and uploads
flow while the build, memory, upload and embedding consumers are each ``kill -9``ed and started
again every few seconds; a few poison records ride along. The test stops by itself: the load and
the kills last ``LOAD_S``, then it waits (bounded) for everything to settle and reads the truth
from PostgreSQL and the topics:

* every build request is answered;
* every memory write is answered ``written`` and stored once: revisions = writes, one head per
  chain, chains linear (the database refuses a fork; the test counts);
* every upload is ``ready``, its chunk count matches, and no chunk is stored twice;
* the dead-letter topics hold only the poison that was sent, and all of it.

A ``kill -9`` in the middle of a record that was already a suspect, running alone, counts as a
crash of that record: the runtime cannot tell a monkey from a record that killed its process.
This test kills far more often than any deployment, so it raises ``max_crashes`` to keep the
innocent records alive; the crash-loop tests hold the default (test_crash_loop.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from broker.topics import (
    dead_letter_topic,
    ensure_topics,
    memory_topics,
    upload_topics,
)
from tests.integration.conftest import Config, spawn_build_consumer
from tests.integration.helpers import producer, request_message
from tests.integration.test_crash_loop import Reader

pytestmark = pytest.mark.integration

ORG = uuid.UUID("7d000000-0000-4000-8000-0000000000c1")
DEFINITION = uuid.UUID("7d000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7d000000-0000-4000-8000-00000000e001")
CONSUMERS = ("build", "memory", "upload", "embed")
LOAD_S = 40.0
KILL_EVERY_S = (2.0, 4.0)
CHAINS = 12
POISON = b"\xff poison, not JSON "


class Monkey:
    """One process per consumer; every few seconds one of them, at random, is SIGKILLed and
    started again at once (as a supervisor would)."""

    def __init__(self, config: Config, logs: Path) -> None:
        self.config = config
        self.logs = logs
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.kills = dict.fromkeys(CONSUMERS, 0)
        self.random = random.Random(17)

    async def start(self, consumer: str) -> None:
        path = self.logs / f"{consumer}-{self.kills[consumer]}.log"
        with path.open("wb") as log:
            self.processes[consumer] = await spawn_build_consumer(
                self.config, stderr=log, consumer=consumer
            )

    async def rampage(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            await asyncio.sleep(self.random.uniform(*KILL_EVERY_S))
            victim = self.random.choice(CONSUMERS)
            process = self.processes[victim]
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
            await process.wait()
            self.kills[victim] += 1
            await self.start(victim)

    def alive(self) -> bool:
        return all(p.returncode is None for p in self.processes.values())

    def log(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1200:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
            await process.wait()


def remember(correlation_id: str, reply_to: str, chain: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "action": "remember",
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "idempotency_key": f"k-{correlation_id}",
        "principal": {
            "organization_id": str(ORG),
            "definition_id": str(DEFINITION),
            "user_id": str(USER),
        },
        "memory": {
            "scope": "user",
            "attribute": f"observation.chaos_{chain}",
            "text": f"revision {correlation_id}",  # new text: each write appends a revision
        },
    }


def upload(correlation_id: str, reply_to: str) -> dict[str, Any]:
    paragraphs = "\n\n".join(f"Paragraph {i} of {correlation_id}." for i in range(40))
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(ORG),
        "title": f"Doc {correlation_id}",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://chaos/{correlation_id}",
        "content": {"text": f"# Doc\n\n{paragraphs}"},
    }


class Load:
    """What was sent and acknowledged by the broker, by kind."""

    def __init__(self, config: Config, reply_to: str) -> None:
        self.config = config
        self.reply_to = reply_to
        self.builds: list[str] = []
        self.writes: list[str] = []
        self.uploads: list[str] = []
        self.poison: dict[str, int] = {}

    async def run(self, until: float) -> None:
        send = await producer(self.config.bootstrap)
        topics = self.config.topics
        loop = asyncio.get_running_loop()
        tick = 0
        try:
            while loop.time() < until:
                tick += 1
                for _ in range(2):
                    cid = f"build-{len(self.builds)}"
                    await send.send_and_wait(
                        topics.build_request,
                        json.dumps(request_message(cid, self.reply_to)).encode(),
                        key=cid.encode(),
                    )
                    self.builds.append(cid)
                    cid = f"write-{len(self.writes)}"
                    chain = len(self.writes) % CHAINS
                    await send.send_and_wait(
                        topics.memory_write,
                        json.dumps(remember(cid, self.reply_to, chain)).encode(),
                        key=f"chain-{chain}".encode(),
                    )
                    self.writes.append(cid)
                if tick % 20 == 0:
                    cid = f"upload-{len(self.uploads)}"
                    await send.send_and_wait(
                        topics.upload, json.dumps(upload(cid, self.reply_to)).encode()
                    )
                    self.uploads.append(cid)
                if tick % 50 == 0:
                    for topic in (topics.build_request, topics.memory_write, topics.upload):
                        await send.send_and_wait(topic, POISON + str(tick).encode())
                        self.poison[topic] = self.poison.get(topic, 0) + 1
                await asyncio.sleep(0.1)
        finally:
            await send.stop()


@pytest.mark.timeout(600)
async def test_kill_9_on_every_consumer_under_load_loses_and_doubles_nothing(
    config: Config, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'Chaos')", ORG)
    for section in CONSUMERS:
        config = config.with_(section, max_crashes=50)
    await ensure_topics(
        config.bootstrap, [*memory_topics(config.topics), *upload_topics(config.topics)]
    )
    reply_to = config.reply_topic("chaos")
    reader = Reader()
    await reader.follow(config.bootstrap, reply_to)
    letters = {
        topic: dead_letter_topic(topic)
        for topic in (config.topics.build_request, config.topics.memory_write, config.topics.upload)
    }
    for topic in [*letters.values(), dead_letter_topic(config.topics.embed)]:
        await reader.follow(config.bootstrap, topic)
    monkey = Monkey(config, tmp_path)
    for consumer in CONSUMERS:
        await monkey.start(consumer)
    load = Load(config, reply_to)
    until = asyncio.get_running_loop().time() + LOAD_S
    replies = reader.records[reply_to]

    def parked(letters_topic: str) -> set[tuple[int, int]]:
        """The distinct records parked (a letter may come twice: at least once)."""
        return {(r["partition"], r["offset"]) for r in reader.records[letters_topic]}

    def settled() -> bool:
        answered = {r["correlation_id"] for r in replies}
        ready = {r["correlation_id"] for r in replies if r.get("status") == "ready"}
        return (
            set(load.builds) | set(load.writes) <= answered
            and set(load.uploads) <= ready
            and all(len(parked(d)) == load.poison.get(t, 0) for t, d in letters.items())
        )

    try:
        await asyncio.gather(load.run(until), monkey.rampage(until))
        assert sum(monkey.kills.values()) >= 8, monkey.kills
        async with asyncio.timeout(300):
            while not settled():
                assert monkey.alive(), monkey.log()  # no kills now: nothing may die by itself
                await asyncio.sleep(0.5)
    finally:
        await monkey.stop()
        await reader.close()

    print(
        f"chaos: {monkey.kills} kills; {len(load.builds)} builds, {len(load.writes)} memory"
        f" writes, {len(load.uploads)} uploads, {sum(load.poison.values())} poison records"
    )
    by_id: dict[str, list[dict[str, Any]]] = {}
    for reply in replies:
        by_id.setdefault(reply["correlation_id"], []).append(reply)
    # builds: every one answered with a brief (a duplicate answer is at-least-once, allowed)
    assert {r["status"] for cid in load.builds for r in by_id[cid]} == {"ok"}
    # memory: every write answered written, and stored once
    assert {r["status"] for cid in load.writes for r in by_id[cid]} == {"written"}
    revisions = await admin.fetchval(
        "SELECT count(*) FROM memories WHERE organization_id = $1", ORG
    )
    assert revisions == len(load.writes)
    chains = await admin.fetch(
        "SELECT subject_key, count(*) FILTER (WHERE supersedes_id IS NULL) AS roots, count(*) AS n"
        " FROM memories WHERE organization_id = $1 GROUP BY subject_key",
        ORG,
    )
    assert len(chains) == min(CHAINS, len(load.writes))
    assert {r["roots"] for r in chains} == {1}  # one root each; 00009 refuses a fork
    heads = await admin.fetchval(
        "SELECT count(*) FROM memories m WHERE organization_id = $1 AND NOT EXISTS"
        " (SELECT 1 FROM memories c WHERE c.organization_id = m.organization_id"
        "  AND c.supersedes_id = m.id)",
        ORG,
    )
    assert heads == len(chains)  # one current head per chain
    # uploads: every one ready, its chunks stored once
    sources = await admin.fetch(
        "SELECT s.uri, s.status, m.chunk_count, m.chunks_stored,"
        " (SELECT count(*) FROM knowledge_chunks c WHERE c.source_id = s.id) AS stored"
        " FROM knowledge_sources s JOIN knowledge_source_models m ON m.source_id = s.id"
    )
    assert sorted(r["uri"] for r in sources) == sorted(f"docs://chaos/{c}" for c in load.uploads)
    assert {r["status"] for r in sources} == {"ready"}
    assert all(r["chunk_count"] == r["chunks_stored"] == r["stored"] for r in sources), sources
    doubled = await admin.fetchval(
        "SELECT count(*) FROM (SELECT source_id, embedding_model, generation, ordinal"
        " FROM knowledge_chunks GROUP BY 1, 2, 3, 4 HAVING count(*) > 1) AS d"
    )
    assert doubled == 0
    # dead letters: the poison, all of it, and nothing else
    for topic, letters_topic in letters.items():
        found = reader.records[letters_topic]
        assert {letter["cause"] for letter in found} <= {"not_json"}, found
        assert {letter["payload"][:5] for letter in found} <= {POISON.decode(errors="replace")[:5]}
        assert len(parked(letters_topic)) == load.poison.get(topic, 0)
    assert not reader.records[dead_letter_topic(config.topics.embed)]
