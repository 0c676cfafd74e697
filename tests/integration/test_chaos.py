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
import random
import signal
from pathlib import Path

import asyncpg
import pytest

from broker.topics import (
    dead_letter_topic,
    ensure_topics,
    memory_topics,
    upload_topics,
)
from tests.integration.helpers import logs_tail
from tests.integration.load import ORG, POISON, MixedLoad
from tests.integration.test_crash_loop import Reader
from tests.services import Config, spawn_build_consumer

pytestmark = pytest.mark.integration

CONSUMERS = ("build", "memory", "upload", "embed")
LOAD_S = 40.0
KILL_EVERY_S = (2.0, 4.0)
CHAINS = 12


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
        return logs_tail(self.logs)

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
            await process.wait()


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
    load = MixedLoad(config, reply_to, per_tick=2, chains=CHAINS, upload_every=20, poison_every=50)
    until = asyncio.get_running_loop().time() + LOAD_S
    replies = reader.records[reply_to]

    def parked(letters_topic: str) -> set[tuple[int, int]]:
        """The distinct records parked (a letter may come twice: at least once)."""
        return {(r["partition"], r["offset"]) for r in reader.records[letters_topic]}

    def settled() -> bool:
        return load.answered(replies) and all(
            len(parked(d)) == load.poison.get(t, 0) for t, d in letters.items()
        )

    try:
        loop = asyncio.get_running_loop()
        await asyncio.gather(load.run(lambda: loop.time() >= until), monkey.rampage(until))
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
    await load.assert_settled_truth(admin, replies)
    # dead letters: the poison, all of it, and nothing else
    for topic, letters_topic in letters.items():
        found = reader.records[letters_topic]
        assert {letter["cause"] for letter in found} <= {"not_json"}, found
        assert {letter["payload"][:5] for letter in found} <= {POISON.decode(errors="replace")[:5]}
        assert len(parked(letters_topic)) == load.poison.get(topic, 0)
    assert not reader.records[dead_letter_topic(config.topics.embed)]
