"""The broker restarts in the middle of the load (issue 17: every promise is proven under faults).

The test runs its own durable broker (Tansu on ``s3://`` storage, a local S3 server beside it;
``DevStack`` with ``durable=True``, its own home and ports) and the shared PostgreSQL. The build
and memory consumers run as their own processes, the real clients drive load, and the broker is
stopped with SIGTERM and started again, then killed with SIGKILL, kept down past the group's
session timeout and started again, each time on the same storage. What must hold:

* the consumer processes keep running: they reconnect by themselves;
* the clients resume; a call in flight during an outage may fail (a memory write is then
  retried with its idempotency key), and no call that overlapped no outage may;
* every acknowledged memory write is in PostgreSQL exactly once: one journal row and one
  revision, the ones its answer named; the chain every writer shares stays linear;
* every build request sent after the broker came back is answered.

The load comes in grants (so many calls per phase, whatever the machine's speed): a durable
Tansu reads more of S3 per fetch the longer a partition grows (``TANSU_S3_FETCH_MAX_WAIT_MS``),
so the volume stays bounded. Only while the broker is being stopped do calls go on without a
grant: Tansu serves its connections for seconds after a SIGTERM, and calls must be in flight
when it goes. Nothing is timed against a wall clock: each phase waits for
answers, under the call timeouts and the test's bound. ``pytest -s`` prints what was measured.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from aiokafka.errors import KafkaError

from broker.topics import build_topics, memory_topics
from devstack.stack import DevSettings, DevStack
from producers.client import ChannelOptions, ContextClient
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextRequest, ContextSubject
from schemas.errors import ReplyTimeout
from schemas.memory import Invoker, MemoryAnswerV1, MemoryCandidate
from tests.integration.helpers import free_port, until
from tests.services import Config, ConsumerProcess, StartConsumer

pytestmark = pytest.mark.integration

ORG = uuid.UUID("7c000000-0000-4000-8000-0000000000a1")
DEFINITION = uuid.UUID("7c000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7c000000-0000-4000-8000-00000000e001")
PRINCIPAL = Invoker(organization_id=ORG, definition_id=DEFINITION, user_id=USER)
REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=ORG, user_id=USER, trigger_id=None, definition_id=DEFINITION
    ),
    query="what do we know?",
    entities=(),
)
POLICY = ContextPolicy.model_validate(
    {"total_token_budget": 300, "sources": [{"name": "memory", "token_budget": 300}]}
)
SHARED_CHAIN = "observation.stage"  # every third write of every writer supersedes its head

MEMORY_WRITERS = 4
BUILD_SENDERS = 2
MEMORY_PER_PHASE = 40  # granted at the start and after each restart
BUILDS_PER_PHASE = 12
ANSWERED_TO_GO_ON = (30, 6)  # (memory, build) answers to calls sent in the phase
CALL_TIMEOUT_S = 60.0  # far past a restart and a group's rejoin (session 6 s, a join 3-5 s)
ATTEMPTS = 4  # a call is sent at most this often (each failure needs an outage to excuse it)
SHORT_OUTAGE_S = 2.0  # how long the broker stays down: the fault injected, not a measurement
PHASE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Attempt:
    kind: str  # "memory" or "build"
    key: str  # the memory write's idempotency key, or the build's number and attempt
    started: float
    ended: float
    error: str | None  # None: answered


@dataclass
class Load:
    """The calls granted, what the clients saw attempt by attempt, and when the broker was down."""

    attempts: list[Attempt] = field(default_factory=list)
    outages: list[list[float]] = field(default_factory=list)  # [down, back]; back inf while down
    answers: dict[str, MemoryAnswerV1] = field(default_factory=dict)  # by idempotency key
    sent: list[str] = field(default_factory=list)  # idempotency keys, in the order first sent
    memory_permits: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    build_permits: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    flowing: bool = False

    def flow(self, on: bool) -> None:
        """While on, workers call without a grant (those waiting for one are woken)."""
        self.flowing = on
        if on:
            self.grant(MEMORY_WRITERS, BUILD_SENDERS)

    def grant(self, memory: int, builds: int) -> None:
        for _ in range(memory):
            self.memory_permits.release()
        for _ in range(builds):
            self.build_permits.release()

    def finish(self) -> None:
        """Every worker returns once its call in flight is answered (or has failed for good)."""
        self.stop.set()
        self.grant(MEMORY_WRITERS, BUILD_SENDERS)

    def down(self) -> None:
        self.outages.append([time.monotonic(), math.inf])

    def back(self) -> float:
        self.outages[-1][1] = time.monotonic()
        return self.outages[-1][1]

    def record(self, kind: str, key: str, started: float, error: BaseException | None) -> None:
        described = None if error is None else f"{type(error).__name__}: {error}"
        self.attempts.append(Attempt(kind, key, started, time.monotonic(), described))

    def answered_since(self, kind: str, since: float) -> int:
        """Answers to calls of ``kind`` that were sent after ``since``."""
        return sum(
            1 for a in self.attempts if a.kind == kind and a.error is None and a.started > since
        )

    def first_answer_after(self, kind: str, since: float, *, sent_after: bool) -> float:
        """Seconds from ``since`` to the first answer of ``kind`` that arrived after it, to a
        call sent before it (in flight) or after it."""
        ends = [
            a.ended
            for a in self.attempts
            if a.kind == kind
            and a.error is None
            and a.ended > since
            and (a.started > since) == sent_after
        ]
        return min(ends) - since if ends else math.nan

    def resumed_after(self, since: float) -> str:
        return ", ".join(
            f"{kind} {self.first_answer_after(kind, since, sent_after=False):.2f} s in flight, "
            f"{self.first_answer_after(kind, since, sent_after=True):.2f} s sent after"
            for kind in ("memory", "build")
        )

    def unexcused(self) -> list[Attempt]:
        """Failed attempts that no outage overlapped: a call the broker's faults cannot explain."""
        return [
            a
            for a in self.attempts
            if a.error is not None
            and not any(down < a.ended and a.started < back for down, back in self.outages)
        ]


async def remember(memory: MemoryClient, load: Load, writer: int, number: int) -> None:
    """One memory write, sent again with its idempotency key until it is answered."""
    key = f"w{writer}-{number}"
    attribute = SHARED_CHAIN if number % 3 == 0 else f"observation.w{writer}_{number}"
    candidate = MemoryCandidate(scope="organization", attribute=attribute, text=f"fact {key}")
    load.sent.append(key)
    for _ in range(ATTEMPTS):
        started = time.monotonic()
        try:
            answer = await memory.remember(
                PRINCIPAL, candidate, idempotency_key=key, timeout=CALL_TIMEOUT_S
            )
        except (ReplyTimeout, KafkaError) as error:
            load.record("memory", key, started, error)
            continue
        load.record("memory", key, started, None)
        load.answers[key] = answer
        return


async def build(client: ContextClient, load: Load, number: int) -> None:
    """One build request, sent again when it fails (a new request: a build has no effect)."""
    for attempt in range(ATTEMPTS):
        started = time.monotonic()
        try:
            reply = await client.request(REQUEST, POLICY, timeout=CALL_TIMEOUT_S)
        except (ReplyTimeout, KafkaError) as error:
            load.record("build", f"b{number}.{attempt}", started, error)
            continue
        assert reply.status == "ok", reply
        load.record("build", f"b{number}.{attempt}", started, None)
        return


async def worker(
    load: Load, permits: asyncio.Semaphore, call: Callable[[int], Awaitable[None]]
) -> None:
    for number in itertools.count():
        if not load.flowing:
            await permits.acquire()
        if load.stop.is_set():
            return
        await call(number)


def alive(consumers: list[ConsumerProcess]) -> None:
    for consumer in consumers:
        assert consumer.process.returncode is None, (
            f"the {consumer.consumer} consumer exited ({consumer.process.returncode}): "
            f"{consumer.log()[-3000:]}"
        )


async def answered(load: Load, since: float, consumers: list[ConsumerProcess]) -> None:
    """Wait until calls of both kinds sent after ``since`` are answered (``ANSWERED_TO_GO_ON``)."""
    memory, builds = ANSWERED_TO_GO_ON
    try:
        await until(
            lambda: (
                load.answered_since("memory", since) >= memory
                and load.answered_since("build", since) >= builds
            ),
            timeout=PHASE_TIMEOUT_S,
        )
    except TimeoutError:
        alive(consumers)
        recent = [a for a in load.attempts if a.ended > since]
        raise AssertionError(
            f"not answered: {load.answered_since('memory', since)} memory and "
            f"{load.answered_since('build', since)} build calls sent since; the last attempts: "
            f"{recent[-10:]}; logs: "
            + " | ".join(f"{c.consumer}: {c.log()[-1500:]}" for c in consumers)
        ) from None


@pytest.fixture
async def durable_stack(tmp_path: Path) -> AsyncIterator[DevStack]:
    """A durable broker of this test's own: its home, its broker and S3 ports (never the shared
    stack's); stopped with its S3 server at the end, whatever the test left running."""
    kafka_port = free_port()
    s3_port = free_port()
    while s3_port == kafka_port:
        s3_port = free_port()
    stack = DevStack(
        DevSettings(
            home=tmp_path / "durable-stack",
            kafka_port=kafka_port,
            s3_port=s3_port,
            pg_port=free_port(),  # never started: the database is the shared one
            durable=True,
        )
    )
    yield stack
    await asyncio.to_thread(stack.down)


@pytest.mark.timeout(600)
async def test_consumers_and_clients_ride_out_broker_restarts_and_nothing_is_lost_or_doubled(
    durable_stack: DevStack,
    config: Config,
    admin: asyncpg.Connection,
    start_consumer: StartConsumer,
) -> None:
    stack = durable_stack
    cfg = config.with_(
        "kafka",
        bootstrap_servers=stack.bootstrap_servers,
        fetch_max_wait_ms=stack.fetch_max_wait_ms,  # S3 reads need more than the 2 ms default
    )
    started, _ = await stack.up_broker([*build_topics(cfg.topics), *memory_topics(cfg.topics)])
    assert started
    storage = stack.broker_storage()
    assert storage is not None
    assert storage.durable
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'Restarts')", ORG)
    consumers = [
        await start_consumer(cfg, consumer="build"),
        await start_consumer(cfg, consumer="memory"),
    ]
    load = Load()
    measured: list[str] = []
    options = ChannelOptions(
        bootstrap_servers=cfg.bootstrap,
        reply_topic_prefix=cfg.topics.reply_prefix,
        fetch_max_wait_ms=cfg.kafka.fetch_max_wait_ms,
    )
    async with (
        MemoryClient(memory_topic=cfg.topics.memory_write, **options) as memory,
        ContextClient(request_topic=cfg.request_topic, **options) as builds,
    ):
        workers = [
            *(
                asyncio.create_task(
                    worker(load, load.memory_permits, functools.partial(remember, memory, load, w))
                )
                for w in range(MEMORY_WRITERS)
            ),
            *(
                asyncio.create_task(
                    worker(load, load.build_permits, functools.partial(build, builds, load))
                )
                for _ in range(BUILD_SENDERS)
            ),
        ]
        try:
            phase = time.monotonic()
            load.grant(MEMORY_PER_PHASE, BUILDS_PER_PHASE)
            await answered(load, phase, consumers)
            # the second outage outlasts the group's session timeout
            session_s = cfg.kafka.session_timeout_ms / 1000
            for sig, outage_s in (
                (signal.SIGTERM, SHORT_OUTAGE_S),
                (signal.SIGKILL, session_s + 4),
            ):
                load.flow(True)  # calls go on until the broker is gone, however long it takes
                load.down()
                stopped = time.monotonic()
                assert await asyncio.to_thread(stack.stop_broker, sig)
                stopped_s = time.monotonic() - stopped
                load.flow(False)
                in_flight = len(load.sent) - len(load.answers)
                await asyncio.sleep(outage_s)
                starting = time.monotonic()
                assert await asyncio.to_thread(stack.start_broker)
                back = load.back()
                load.grant(MEMORY_PER_PHASE, BUILDS_PER_PHASE)
                await answered(load, back, consumers)
                alive(consumers)
                measured.append(
                    f"{sig.name}: stop {stopped_s:.2f} s, down {outage_s:g} s more, start "
                    f"{back - starting:.2f} s, {in_flight} memory writes unanswered at the stop; "
                    f"first answer after the restart: {load.resumed_after(back)}"
                )
        except BaseException:
            for task in workers:  # a failed phase says why now, not after the calls time out
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        load.finish()
        async with asyncio.timeout(ATTEMPTS * CALL_TIMEOUT_S + 30):
            results = await asyncio.gather(*workers, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        # every build request sent now, after both restarts, is answered
        replies = await asyncio.gather(
            *(builds.request(REQUEST, POLICY, timeout=CALL_TIMEOUT_S) for _ in range(10))
        )
        assert {reply.status for reply in replies} == {"ok"}
    alive(consumers)

    failed = [a for a in load.attempts if a.error is not None]
    measured.append(
        f"{len(load.sent)} memory writes, "
        f"{sum(1 for a in load.attempts if a.kind == 'build')} build attempts, "
        f"{len(failed)} failed attempts: {[(a.kind, a.error) for a in failed][:6]}"
    )
    for consumer in consumers:
        errors = [line for line in consumer.log().splitlines() if '"level": "ERROR"' in line]
        measured.append(f"{consumer.consumer} consumer: {len(errors)} ERROR log lines")
    print("\n[broker restarts]\n" + "\n".join(measured))

    assert load.unexcused() == [], "calls failed that no outage overlapped"
    assert sorted(load.answers) == sorted(load.sent), "a memory write was never answered"
    outcomes = {key: (a.status, a.change, a.reason) for key, a in load.answers.items()}
    wrong = {key: outcome for key, outcome in outcomes.items() if outcome[0] != "written"}
    assert wrong == {}, "every write has fresh text: each one is written"

    # exactly once: one journal row and one revision per write, the ones the answers named
    journal = {
        row["idempotency_key"]: (row["outcome"], row["memory_id"])
        for row in await admin.fetch(
            "SELECT idempotency_key, outcome, memory_id FROM memory_writes"
            " WHERE organization_id = $1",
            ORG,
        )
    }
    named = {
        key: (answer.change, answer.memory.id if answer.memory else None)
        for key, answer in load.answers.items()
    }
    assert journal == named
    texts = await admin.fetch(
        "SELECT text, count(*) AS n FROM memories WHERE organization_id = $1 GROUP BY text", ORG
    )
    assert {row["text"]: row["n"] for row in texts} == {f"fact {key}": 1 for key in load.sent}
    ids = [memory_id for _, memory_id in named.values()]
    assert await admin.fetchval("SELECT count(*) FROM memories WHERE id = ANY($1)", ids) == len(
        load.sent
    )

    # the shared chain is linear: one root, one child per revision, one head
    chain = await admin.fetch(
        "SELECT id, supersedes_id FROM memories WHERE organization_id = $1"
        " AND subject_key LIKE '%:' || $2",
        ORG,
        SHARED_CHAIN,
    )
    parents = [row["supersedes_id"] for row in chain if row["supersedes_id"] is not None]
    assert len(chain) == sum(1 for key in load.sent if int(key.split("-")[1]) % 3 == 0)
    assert len(parents) == len(set(parents)) == len(chain) - 1
    heads = await admin.fetchval(
        "SELECT count(*) FROM memory_heads WHERE organization_id = $1"
        " AND subject_key LIKE '%:' || $2",
        ORG,
        SHARED_CHAIN,
    )
    assert heads == 1
