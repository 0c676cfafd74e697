"""A record that kills its process is counted and dead-lettered, for each consumer (issue 17).

Each test runs the real consumer with a handler that SIGKILLs its own process on a marked record
(:mod:`tests.integration.crashing`), under a watchdog that restarts it whenever it dies, as
Kubernetes would. Before the start journal, the committed offset stayed on the record and the
process died on it for ever. Now: the record dies once among others, then alone
``max_crashes`` (2) times, and on the next start it is dead-lettered with
``crashed_the_consumer``; its caller is told (but for the embedding batch, which has none); and
the valid records queued behind it on the same partition are handled.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer

from broker.topics import dead_letter_topic, ensure_topics, memory_topics, upload_topics
from tests.integration.crashing import KILL_MARK
from tests.integration.helpers import (
    assigned_reader,
    producer,
    remember_message,
    request_message,
)
from tests.integration.test_memory_consumer import ORG as MEMORY_ORG
from tests.integration.test_memory_consumer import PRINCIPAL as MEMORY_PRINCIPAL
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

MAX_CRASHES = 2
VALID = 3
UPLOAD_ORG = uuid.UUID("7c000000-0000-4000-8000-0000000000a1")


class Watchdog:
    """Runs ``python -m tests.integration.crashing <consumer>`` and starts it again each time
    it dies; counts the deaths."""

    def __init__(self, config: Config, consumer: str, logs: Path) -> None:
        self.config = config
        self.consumer = consumer
        self.logs = logs
        self.deaths = 0
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = (self.logs / f"{self.consumer}-{self.deaths}.log").open("wb")
        with log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration.crashing",
                self.consumer,
                env=self.config.environ(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )

    async def watch(self, done: Callable[[], bool], *, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                assert self.process is not None
                if self.process.returncode is not None:
                    self.deaths += 1
                    assert self.deaths <= MAX_CRASHES + 3, self.log()
                    await self.start()
                await asyncio.sleep(0.1)

    def log(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.logs.glob(f"{self.consumer}-*.log"))
        )

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


class Reader:
    """Collects every JSON record of some topics in the background."""

    def __init__(self) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers: list[AIOKafkaConsumer] = []

    async def follow(self, bootstrap: str, topic: str) -> None:
        consumer = await assigned_reader(bootstrap, topic)
        self._consumers.append(consumer)
        found = self.records.setdefault(topic, [])

        async def read() -> None:
            async for message in consumer:
                found.append(json.loads(message.value or b"null"))

        self._tasks.append(asyncio.create_task(read()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for consumer in self._consumers:
            await consumer.stop()


@dataclass
class Scenario:
    consumer: str
    topic: str
    records: list[bytes]  # the poison first, then the valid ones; one key, one partition
    answered: Callable[[Reader], bool]
    """Every valid record's effect is visible."""


async def crash_loop(
    config: Config, scenario: Scenario, tmp_path: Path, reader: Reader, timeout: float = 240
) -> None:
    letters_topic = dead_letter_topic(scenario.topic)
    await reader.follow(config.bootstrap, letters_topic)
    send = await producer(config.bootstrap)
    try:
        for value in scenario.records:
            await send.send_and_wait(scenario.topic, value, key=b"one-partition")
    finally:
        await send.stop()
    watchdog = Watchdog(config, scenario.consumer, tmp_path)
    await watchdog.start()
    try:
        await watchdog.watch(
            lambda: bool(reader.records.get(letters_topic)) and scenario.answered(reader),
            timeout=timeout,
        )
    finally:
        await watchdog.stop()
    # died once among the others, then alone max_crashes times; the next start parked it
    assert watchdog.deaths == MAX_CRASHES + 1, watchdog.log()
    [letter] = reader.records[letters_topic]
    assert letter["cause"] == "crashed_the_consumer"
    assert f"down {MAX_CRASHES} times while it ran alone" in letter["reason"]
    assert KILL_MARK.decode() in letter["payload"]


def crash_config(config: Config, section: str) -> Config:
    return config.with_(section, max_crashes=MAX_CRASHES)


Message = Callable[[str, str, bool], dict[str, Any]]
"""``(correlation id, reply topic, poison?)`` -> a request of a consumer's topic."""


async def poisoned_requests(
    config: Config, consumer: str, topic: str, message: Message, tmp_path: Path
) -> dict[str, Any]:
    """A poison request and ``VALID`` valid ones behind it, through the crash loop; every valid
    one answered. Returns the poison's own answer (the runtime's farewell)."""
    reply_to = config.reply_topic("crash")
    reader = Reader()
    await reader.follow(config.bootstrap, reply_to)
    replies = reader.records[reply_to]
    valid = {f"valid-{i}" for i in range(VALID)}
    records = [message("poison", reply_to, True)]
    records += [message(cid, reply_to, False) for cid in sorted(valid)]

    def answered(_: Reader) -> bool:
        return valid <= {r["correlation_id"] for r in replies}

    try:
        encoded = [json.dumps(m).encode() for m in records]
        await crash_loop(config, Scenario(consumer, topic, encoded, answered), tmp_path, reader)
    finally:
        await reader.close()
    [farewell] = [r for r in replies if r["correlation_id"] == "poison"]
    return farewell


def build_request(correlation_id: str, reply_to: str, poison: bool) -> dict[str, Any]:
    message = request_message(correlation_id, reply_to)
    if poison:
        message["request"]["query"] = KILL_MARK.decode()
    return message


def memory_write(correlation_id: str, reply_to: str, poison: bool) -> dict[str, Any]:
    if poison:
        return remember_message(correlation_id, reply_to, MEMORY_PRINCIPAL, text=KILL_MARK.decode())
    return remember_message(correlation_id, reply_to, MEMORY_PRINCIPAL)


def upload_message(correlation_id: str, reply_to: str, poison: bool) -> dict[str, Any]:
    text = f"# Bomb\n\n{KILL_MARK.decode()}" if poison else "# Notes\n\nRefunds."
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(UPLOAD_ORG),
        "title": "Notes",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://{correlation_id}",
        "content": {"text": text},
    }


@pytest.mark.timeout(300)
async def test_a_build_request_that_kills_the_consumer_is_parked_and_its_caller_told(
    config: Config, tmp_path: Path
) -> None:
    config = crash_config(config, "build")
    farewell = await poisoned_requests(
        config, "build", config.request_topic, build_request, tmp_path
    )
    assert farewell["status"] == "error"
    assert farewell["error"]["code"] == "internal_error"
    assert "crashed_the_consumer" in farewell["error"]["message"]


@pytest.mark.timeout(300)
async def test_a_memory_write_that_kills_the_consumer_is_parked_and_its_caller_told(
    config: Config, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'M')", MEMORY_ORG)
    config = crash_config(config, "memory")
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    farewell = await poisoned_requests(
        config, "memory", config.topics.memory_write, memory_write, tmp_path
    )
    assert (farewell["status"], farewell["reason"]) == ("refused", "not_handled")
    written = await admin.fetchval("SELECT count(*) FROM memories")
    assert written == VALID  # the poison wrote nothing, every valid call wrote once


@pytest.mark.timeout(300)
async def test_an_upload_that_kills_the_consumer_is_parked_and_its_uploader_told(
    config: Config, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'U')", UPLOAD_ORG)
    config = crash_config(config, "upload")
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    farewell = await poisoned_requests(
        config, "upload", config.topics.upload, upload_message, tmp_path
    )
    assert farewell["status"] == "rejected"
    assert "crashed_the_consumer" in farewell["reason"]


@pytest.mark.timeout(400)
async def test_an_embedding_batch_that_kills_the_consumer_is_parked(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    """The poison batch sits before a real upload's batch on the topic's one partition: once it
    is parked, the upload becomes ready."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'E')", UPLOAD_ORG)
    config = crash_config(config.with_("topics", embed_partitions=1), "embed")
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    reply_to = config.reply_topic("crash")
    reader = Reader()
    await reader.follow(config.bootstrap, reply_to)
    replies = reader.records[reply_to]
    poison = {
        "organization_id": str(UPLOAD_ORG),
        "source_id": str(uuid.uuid4()),
        "generation": 1,
        "embedding_model": "sentence-transformers/all-MiniLM-L6-v2",
        "chunks": [{"ordinal": 0, "section": "", "text": KILL_MARK.decode(), "tokens": 3}],
    }
    send = await producer(config.bootstrap)
    try:
        await send.send_and_wait(config.topics.embed, json.dumps(poison).encode(), key=b"x")
        await send.send_and_wait(
            config.topics.upload,
            json.dumps(upload_message("valid", reply_to, False)).encode(),
        )
    finally:
        await send.stop()
    await start_consumer(config, consumer="upload")

    def ready(_: Reader) -> bool:
        return any(r["status"] == "ready" for r in replies)

    try:
        await crash_loop(
            config,
            Scenario("embed", config.topics.embed, [], ready),
            tmp_path,
            reader,
            timeout=360,
        )
    finally:
        await reader.close()
    assert await admin.fetchval("SELECT status FROM knowledge_sources") == "ready"
