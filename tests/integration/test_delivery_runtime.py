"""The delivery runtime through the real broker: many records in flight, crashes, retries that
outlive a process, and the health endpoint (issue 7)."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.error
import urllib.request
import uuid
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import RecordMetadata

from broker.topics import dead_letter_topic
from consumers.runtime.kafka import ConsumerCommitter
from consumers.runtime.records import HEADER_ATTEMPT
from tests.integration import seed
from tests.integration.helpers import (
    ORG,
    assigned_reader,
    free_port,
    producer,
    read_json,
    request_message,
    until_true,
)
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

READING = {  # a build that reads the database: slower than an empty one, so they interleave
    "total_token_budget": 600,
    "sources": [
        {"name": "application", "token_budget": 200},
        {"name": "dossier", "token_budget": 200},
        {"name": "run_history", "token_budget": 200},
    ],
}


async def publish_requests(
    config: Config, reply_topic: str, count: int, company: uuid.UUID
) -> dict[str, tuple[int, int]]:
    """``count`` requests over 4 keys; every other one reads the database. Their positions."""
    send = await producer(config.bootstrap)
    positions: dict[str, tuple[int, int]] = {}
    try:
        pending = []
        for i in range(count):
            correlation_id = f"corr-{i}"
            message = request_message(correlation_id, reply_topic)
            if i % 2:
                message["policy"] = READING
                message["request"]["entities"] = [{"kind": "crm.company", "id": str(company)}]
                message["request"]["subject"]["user_id"] = str(uuid.uuid4())
            future = await send.send(
                config.request_topic, json.dumps(message).encode(), key=str(i % 4).encode()
            )
            pending.append((correlation_id, future))
        for correlation_id, future in pending:
            metadata = await future
            positions[correlation_id] = (metadata.partition, metadata.offset)
    finally:
        await send.stop()
    return positions


@pytest.mark.timeout(300)
@pytest.mark.parametrize("crash", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_a_crash_mid_load_with_records_finishing_out_of_order_loses_no_request(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, crash: int
) -> None:
    org = uuid.UUID(ORG)
    await seed.insert(admin, "organizations", id=org, name="Org")
    company = await seed.company(admin, org, name="Acme", lifecycle_stage="customer")
    reply_topic = config.reply_topic("restart")
    positions = await publish_requests(config, reply_topic, 600, company)

    reader = await assigned_reader(config.bootstrap, reply_topic)
    first = await start_consumer(config)
    seen: list[str] = []
    restarted = False
    try:
        async with asyncio.timeout(240):
            while not set(positions).issubset(seen):
                batch = await reader.getmany(timeout_ms=200)
                for records in batch.values():
                    seen.extend(json.loads(r.value)["correlation_id"] for r in records)
                if not restarted and len(seen) >= 100:
                    await first.stop(crash)  # mid-stream: replies sent, more still queued
                    restarted = True
                    await start_consumer(config)
    finally:
        await reader.stop()

    assert restarted
    assert set(seen) == set(positions)  # every request answered, no stray correlation id
    if crash == signal.SIGTERM:
        # a drained shutdown commits what it answered: nothing is answered twice
        assert len(seen) == len(positions)
    # records of one partition finished out of order (the reply order is not the offset order)
    first_seen = list(dict.fromkeys(seen))
    by_partition: dict[int, list[int]] = {}
    for correlation_id in first_seen:
        partition, offset = positions[correlation_id]
        by_partition.setdefault(partition, []).append(offset)
    assert any(offsets != sorted(offsets) for offsets in by_partition.values())


@pytest.mark.timeout(180)
async def committed_past(bootstrap: str, group_id: str, record: RecordMetadata) -> None:
    """Wait until ``group_id`` has committed past ``record`` (a reader of the group's offsets
    that never joins it)."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id)
    await reader.start()
    try:
        partition = TopicPartition(record.topic, record.partition)

        async def past() -> bool:
            committed: int | None = await reader.committed(partition)
            return bool((committed or 0) > record.offset)

        await until_true(past, timeout=60)
    finally:
        await reader.stop()


async def test_a_retry_count_outlives_the_process_that_counted(
    config: Config, start_consumer: StartConsumer
) -> None:
    """Every attempt times out; the consumer is killed after the first retry is published and
    a new one finishes the count from the record's header: the letter says 3 of 3."""
    settings = config.with_(
        "build",
        handle_timeout_s=1e-6,
        max_attempts=3,
        retry_backoff_s=0.5,
        retry_backoff_max_s=1.0,
    )
    topic = config.request_topic
    # a build that awaits the database, so the 1 µs deadline can strike
    doomed = request_message("doomed", config.reply_topic("x"), policy=READING)
    send = await producer(config.bootstrap)
    try:
        original = await send.send_and_wait(topic, json.dumps(doomed).encode(), key=b"k")
    finally:
        await send.stop()
    first = await start_consumer(settings)
    retries: list[dict[str, Any]] = []
    reader = await assigned_reader(config.bootstrap, topic)
    try:
        async with asyncio.timeout(60):
            while not retries:
                batch = await reader.getmany(timeout_ms=200)
                for records in batch.values():
                    retries += [dict(r.headers) for r in records if r.headers]
    finally:
        await reader.stop()
    # the original's offset committed first: else the kill replays it (at least once: up to
    # commit_interval_s of finished records), a count of its own and a second letter
    await committed_past(config.bootstrap, settings.build.group_id, original)
    await first.stop(signal.SIGKILL)
    assert retries[0][HEADER_ATTEMPT] == b"2"
    await start_consumer(settings)

    [letter] = await read_json(config.bootstrap, dead_letter_topic(topic), until=1, timeout=90)
    assert letter["cause"] == "gave_up"
    assert letter["attempts"] == 3
    assert (letter["partition"], letter["offset"]) == (original.partition, original.offset)
    assert letter["reason"].startswith("timeout: not handled within")


async def test_health_readiness_and_the_in_flight_age_are_served(
    config: Config, start_consumer: StartConsumer
) -> None:
    settings = config.with_("build", metrics_port=free_port())
    await start_consumer(settings)
    base = f"http://127.0.0.1:{settings.build.metrics_port}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    assert await asyncio.to_thread(get, "/healthz") == (200, "ok\n")
    assert await asyncio.to_thread(get, "/readyz") == (200, "ready\n")
    assert (await asyncio.to_thread(get, "/nope"))[0] == 404
    async with asyncio.timeout(30):  # the group assigns partitions a moment after start-up
        while True:
            _, metrics = await asyncio.to_thread(get, "/metrics")
            if "contextcore_consumer_oldest_in_flight_age_seconds{" in metrics:
                break
            await asyncio.sleep(0.5)
    assert (
        f'contextcore_consumer_oldest_in_flight_age_seconds{{consumer="build",partition="0",'
        f'topic="{config.request_topic}"}} 0.0'
    ) in metrics


async def test_the_broker_reports_the_high_watermark_the_lag_is_made_of(config: Config) -> None:
    """The lag gauge (``contextcore_consumer_lag_records``) subtracts where a restart resumes
    from the high watermark the last fetch reported: the broker must report it right (Tansu's
    ListOffsets does not; its fetch responses must)."""
    topic = f"{config.request_topic}.lag"
    reader = await assigned_reader(config.bootstrap, topic)
    send = await producer(config.bootstrap)
    try:
        for i in range(5):
            await send.send_and_wait(topic, b"{}", key=str(i).encode())
        committer = ConsumerCommitter(reader)
        read = 0
        for _ in range(100):  # the watermark is as the last fetch saw it: read to the end
            batches = await reader.getmany(timeout_ms=100)
            read += sum(len(records) for records in batches.values())
            if read >= 5 and committer.high_watermark((topic, 0)) == 5:
                break
        assert read == 5
        assert committer.high_watermark((topic, 0)) == 5
        assert committer.high_watermark((topic, 1)) is None  # not assigned
    finally:
        await send.stop()
        await reader.stop()
