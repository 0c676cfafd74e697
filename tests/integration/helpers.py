"""Plain-aiokafka helpers: the tests talk to the broker without our client where it matters."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from broker.topics import TopicSpec, ensure_topics
from contextcore.knowledge.encoding import Encoder
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from schemas.memory import Invoker

ORG = "6f1c2a3b-0000-4000-8000-000000000001"


def request_message(correlation_id: str, reply_to: str, **overrides: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "schema_version": 1,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "request": {
            "subject": {
                "organization_id": ORG,
                "user_id": None,
                "trigger_id": None,
                "definition_id": None,
            },
            "query": "who is Acme?",
            "entities": [],
        },
        "policy": {
            "total_token_budget": 500,
            "sources": [],  # the consumer registers no source yet: an empty, admitted policy
        },
    }
    message.update(overrides)
    return message


def remember_message(
    correlation_id: str, reply_to: str, principal: Invoker, **memory: Any
) -> dict[str, Any]:
    """A memory-write ``remember`` as a foreign producer sends it; ``memory`` overrides its
    candidate (a user-scoped note whose text is new)."""
    return {
        "schema_version": 1,
        "action": "remember",
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "idempotency_key": f"k-{correlation_id}",
        "principal": principal.model_dump(mode="json", exclude_defaults=True),
        "memory": {
            "scope": "user",
            "attribute": "observation.note",
            "text": f"note {correlation_id}",
            **memory,
        },
    }


def status_mb(pid: int | str, key: str) -> float:
    """A ``/proc/<pid>/status`` figure in MB (``VmRSS``, ``VmHWM``); ``pid`` may be ``"self"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {key} for process {pid}")


async def producer(bootstrap: str) -> AIOKafkaProducer:
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await client.start()
    return client


async def assigned_reader(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    """A group-less consumer of every partition of ``topic`` from the beginning.

    No group means no join (3-5 s on Tansu); the topic is created first when missing.
    """
    await ensure_topics(bootstrap, [TopicSpec(topic, 1)])
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
        enable_auto_commit=False,
    )
    await consumer.start()
    await consumer.topics()  # refreshes the metadata partitions_for_topic reads
    partitions = consumer.partitions_for_topic(topic) or {0}
    consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
    return consumer


async def read_records(
    bootstrap: str, topic: str, *, until: int, timeout: float = 60.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read ``topic`` from the beginning until ``until`` records arrived."""
    consumer = await assigned_reader(bootstrap, topic)
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < until:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
    except TimeoutError:
        values = [r.value for r in records]
        raise AssertionError(
            f"{topic}: {len(records)} of {until} records in {timeout:.0f} s: {values!r:.2000}"
        ) from None
    finally:
        await consumer.stop()
    return records


async def replies_among(
    bootstrap: str, topics: Iterable[str], correlation_ids: Collection[str]
) -> list[tuple[str, str]]:
    """``(topic, correlation id)`` of every record in ``topics``, read from the beginning to
    the end, whose ``correlation_id`` header (every reply carries it) is one of
    ``correlation_ids``. A topic that does not exist holds none (it is not created: a broker
    that creates a topic on its first record would show one there)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    )
    await consumer.start()
    found: list[tuple[str, str]] = []
    try:
        await consumer.topics()  # metadata of every topic, creating none
        partitions = [
            TopicPartition(topic, partition)
            for topic in sorted(set(topics))
            for partition in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            return found
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        async with asyncio.timeout(60):
            while [p for p, end in ends.items() if await consumer.position(p) < end]:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    for record in batch:
                        # a header of another writer's may hold a null value: not a reply of ours
                        header = dict(record.headers or ()).get("correlation_id") or b""
                        cid = header.decode("utf-8", "replace")
                        if cid in correlation_ids:
                            found.append((record.topic, cid))
    finally:
        await consumer.stop()
    return found


async def read_json(
    bootstrap: str, topic: str, *, until: int, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """Read ``topic`` from the beginning until ``until`` records arrived, as JSON."""
    records = await read_records(bootstrap, topic, until=until, timeout=timeout)
    return [json.loads(record.value) for record in records]


async def settled(
    client: Librdkafka,
    bootstrap: str,
    dead_letters: str,
    sent: Mapping[str, tuple[int, int]],
    *,
    timeout: float = 60.0,
) -> tuple[set[str], list[dict[str, Any]]]:
    """The correlation ids of ``sent`` that ``client`` got a reply to, and the dead letters on
    ``dead_letters``, once each sent record (its correlation id: its partition and offset) has
    one or the other. Waited for, not counted when the last call returned: a consumer runs
    several records at once, so a record's reply may come after a later record's."""
    reader = await assigned_reader(bootstrap, dead_letters)
    letters: list[dict[str, Any]] = []
    unsettled: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                answered = {cid for cid in client.replies if cid in sent}
                parked = {(letter["partition"], letter["offset"]) for letter in letters}
                unsettled = [c for c, at in sent.items() if c not in answered and at not in parked]
                if not unsettled:
                    return answered, letters
                for batch in (await reader.getmany(timeout_ms=200)).values():
                    letters.extend(json.loads(record.value or b"null") for record in batch)
                await asyncio.to_thread(client.collect, 0.2)
    except TimeoutError:
        raise AssertionError(
            f"{len(unsettled)} of {len(sent)} records neither answered nor dead-lettered in "
            f"{timeout:.0f} s: {[(c, sent[c]) for c in unsettled][:20]}"
        ) from None
    finally:
        await reader.stop()


async def run(*command: str, env: dict[str, str], timeout: float = 120) -> tuple[int, str, str]:
    """A command's exit status, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def as_service_role(conn: Any, organization: UUID | None = None) -> None:
    """Inside a transaction: the runtime login as the service role, scoped to ``organization``
    (no scope at all when ``None``, as ``TenantDatabase.writing_each`` opens it)."""
    await conn.execute(
        "SELECT set_config('role', 'contextcore_app', true),"
        " set_config('contextcore.organization_id', $1, true)",
        "" if organization is None else str(organization),
    )


async def waits_on_a_lock(watcher: Any, pid: int, task: asyncio.Task[Any]) -> bool:
    """Whether the session ``pid`` comes to wait on a lock before ``task`` (its statement) is
    done: True when it waits, False when the task finished first. ``watcher`` is a third
    session: one inside a transaction sees the activity as of its first read. Polled: a
    condition of another session, which no event of ours signals."""
    waits = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'"
    async with asyncio.timeout(30):
        while not task.done():
            if await watcher.fetchval(waits, pid):
                return True
            await asyncio.sleep(0.01)
    return False


def free_port() -> int:
    """A port nothing listens on right now (for a metrics endpoint or a spare stack)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Librdkafka:
    """A synchronous librdkafka (confluent-kafka) client, as a foreign service would use one:
    it publishes records and reads one reply topic from its beginning."""

    def __init__(self, bootstrap: str, reply_topic: str, *, max_bytes: int = 2_000_000) -> None:
        """``max_bytes``: the largest record it sends (a foreign producer sets its own)."""
        from confluent_kafka import (
            OFFSET_BEGINNING,
            Consumer,
            KafkaException,
            Producer,
            TopicPartition,
        )
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        # One partition, made before anything replies (Tansu would auto-create four).
        admin = AdminClient({"bootstrap.servers": bootstrap})
        created = admin.create_topics(
            [NewTopic(reply_topic, num_partitions=1, replication_factor=1)]
        )
        try:
            created[reply_topic].result(30)
        except KafkaException as error:
            if "already exists" not in str(error).lower():
                raise
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "message.max.bytes": max_bytes}
        )
        self.reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "unused",  # assigned, never subscribed: no group join
                "enable.auto.commit": False,
                "fetch.wait.max.ms": TANSU_FETCH_MAX_WAIT_MS,
            }
        )
        self.reader.assign([TopicPartition(reply_topic, 0, OFFSET_BEGINNING)])
        self.replies: dict[str, dict[str, Any]] = {}

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes,
        headers: Sequence[tuple[str, str | bytes | None]] | None = None,
    ) -> tuple[int, int]:
        """Publish and wait for the acknowledgement; the record's (partition, offset)."""
        where: list[tuple[int, int]] = []

        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            where.append((message.partition(), message.offset()))

        self.producer.produce(
            topic, value, key=key, headers=list(headers or ()), on_delivery=delivered
        )
        self.producer.flush(30)
        assert where, "the broker did not acknowledge the record"
        return where[0]

    def send_together(self, records: Sequence[tuple[str, bytes, int]]) -> None:
        """Publish ``(topic, value, partition)`` records in one flush, so that they reach the
        broker together, and wait for every acknowledgement."""
        acknowledged: list[object] = []

        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            acknowledged.append(message)

        for topic, value, partition in records:
            self.producer.produce(topic, value, partition=partition, on_delivery=delivered)
        self.producer.flush(30)
        assert len(acknowledged) == len(records), "the broker did not acknowledge every record"

    def reply(self, correlation_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The reply with ``correlation_id`` (keeping every other reply read meanwhile)."""
        deadline = time.monotonic() + timeout
        while correlation_id not in self.replies:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no reply to {correlation_id} within {timeout} s"
            self._read_one(min(remaining, 0.2))
        return self.replies[correlation_id]

    def collect(self, seconds: float) -> None:
        """Keep the replies that arrive within ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self._read_one(min(remaining, 0.2))

    def _read_one(self, timeout: float) -> None:
        message = self.reader.poll(timeout)
        if message is not None and message.error() is None:
            reply = json.loads(message.value() or b"null")
            self.replies[reply["correlation_id"]] = reply

    def close(self) -> None:
        self.reader.close()


async def until(
    condition: Callable[[], object], *, timeout: float = 30.0, every: float = 0.05
) -> None:
    """Wait until ``condition()`` is true: a condition another process makes true, which no
    event of ours can signal. Raises TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(every)


async def until_true(check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0) -> None:
    """:func:`until` for a condition that must be awaited (an HTTP probe, a query)."""
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.2)


def only_encoder(encoder: Encoder) -> Callable[[str], Awaitable[Encoder]]:
    """The knowledge source's ``encoders`` for a process that knows one model."""

    async def get(model: str) -> Encoder:
        assert model == encoder.model
        return encoder

    return get


def logs_tail(directory: Path) -> str:
    """The end of each ``*.log`` of ``directory`` (processes' stderr), named: what a test
    prints when a process it runs died."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1200:]}"
        for p in sorted(directory.glob("*.log"))
    )
