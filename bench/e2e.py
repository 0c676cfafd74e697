"""End-to-end latency and throughput of the build path over Kafka: an open-loop generator.

A librdkafka client (confluent-kafka, as a foreign service would use) publishes build requests
at a fixed rate, each reading all five sources of an organization seeded like
``bench/sources.py``, and reads the replies. Latency runs from the moment a request was *due*
to its reply arriving, so a generator that falls behind cannot hide a slow consumer
(coordinated omission). Prints figures; never passes or fails.

Every step starts on new topics with new consumer processes, warmed up and with their group
settled: Tansu's memory storage costs more CPU per record the longer a partition's log grows,
so a long run on one topic would measure the broker's history, not the step.

    .venv/bin/python -m bench.e2e [--baseline DIR] [--organizations 20] [--seconds 10]
    .venv/bin/python -m bench.e2e --smoke   # every step at one low rate, a second each

For each target (this code, and with ``--baseline`` the code checked out in DIR, e.g. a git
worktree of an earlier commit, measured in the same run):

* sequential round trips (one request at a time): p50 and p99;
* fixed rates with one consumer process (``--rates``): p50, p99, unanswered;
* the highest rate of ``--ladder`` whose p99 stays under 100 ms with every request answered,
  with one and with two consumer processes in one group;
* each consumer's peak RSS, and (this code) the mean time per stage from its /metrics:
  decode, build, serialise, publish, and each commit request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.corpora import CACHE
from bench.processes import peak_rss_mb
from bench.seeded import (
    DEFINITION,
    FULL_POLICY,
    POLICY,
    TYPICAL_POLICY,
    Org,
    Seeded,
    database_name,
    drop,
    prepare,
    request_for,
    seed,
)
from broker.topics import TopicSpec, ensure_topics
from contextcore.storage.pool import with_database
from contextcore.storage.provision import provision_database
from devstack.stack import OWNER, TANSU_FETCH_MAX_WAIT_MS

ROOT = Path(__file__).resolve().parents[1]
CID = re.compile(rb'"correlation_id":\s*"([^"]+)"')
TARGET_P99_S = 0.100
RT = "contextcore_database_round_trips_total"
REPLY_PARTITIONS = 8


# --------------------------------------------------------------------------- the consumers


@dataclass
class Target:
    """A consumer implementation: this repository, or an earlier checkout of it."""

    label: str
    code_dir: Path
    database_url: str
    legacy: bool  # before issue 7: one settings class, one credential, no stage metrics

    def environ(self, topic: str, reply_prefix: str, group: str, port: int) -> dict[str, str]:
        kept = {"CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS", "CONTEXTCORE_BUILD_MAX_IN_FLIGHT"}
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_") or k in kept}
        env["CONTEXTCORE_KNOWLEDGE_CACHE_DIR"] = str(CACHE / "models")  # the encoder, offline
        env["PYTHONPATH"] = str(self.code_dir)
        env["CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"] = BOOTSTRAP[0]
        env["CONTEXTCORE_DATABASE_URL"] = self.database_url
        env["CONTEXTCORE_TOPIC_BUILD_REQUEST"] = topic
        # the reply-topic rule: the generator's reply topic is under this prefix, and the
        # consumer answers no topic outside it (broker/reply_topics.py)
        env["CONTEXTCORE_TOPIC_REPLY_PREFIX"] = reply_prefix
        env["CONTEXTCORE_BUILD_GROUP_ID"] = group
        env["CONTEXTCORE_METRICS_PORT" if self.legacy else "CONTEXTCORE_BUILD_METRICS_PORT"] = str(
            port
        )
        return env


BOOTSTRAP: list[str] = []
KNOWLEDGE: list[Knowledge] = []  # seeded when a workload is "full"


@dataclass
class Consumer:
    process: subprocess.Popen[bytes]
    port: int

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.process.pid)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())


def cpu_seconds() -> dict[str, float]:
    """CPU time used so far by the consumers, PostgreSQL, the broker and this generator."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(("consumers", "postgres", "broker", "generator"), 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, UnicodeDecodeError):
            continue
        used = (int(fields[11]) + int(fields[12])) / tick
        if "serve build" in command:
            totals["consumers"] += used
        elif command.startswith("postgres:") or "pginstall/bin/postgres" in command:
            totals["postgres"] += used
        elif "tansu" in command and BOOTSTRAP[0].rsplit(":", 1)[1] in command:
            totals["broker"] += used
        elif int(stat.parent.name) == os.getpid():
            totals["generator"] += used
    return totals


def cpu_per_request(
    before: dict[str, float], after: dict[str, float], requests: int
) -> dict[str, float]:
    """Milliseconds of CPU per request, by process kind."""
    return {name: (after[name] - before[name]) * 1000 / max(requests, 1) for name in after}


def cpu_line(cpu: dict[str, float]) -> str:
    return "  CPU per request: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def consumers(
    target: Target, topic: str, reply_prefix: str, count: int
) -> Iterator[list[Consumer]]:
    """``count`` consumer processes in one new group, reading ``topic`` and answering under
    ``reply_prefix`` (the reply-topic rule refuses every other reply topic)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    started: list[Consumer] = []
    try:
        for _ in range(count):
            port = free_port()
            with tempfile.TemporaryFile() as errors:
                process = subprocess.Popen(
                    [sys.executable, "-m", "consumers.cli", "serve", "build"],
                    cwd=target.code_dir,
                    env=target.environ(topic, reply_prefix, group, port),
                    stdout=subprocess.PIPE,
                    stderr=errors,
                )
                assert process.stdout is not None
                line = process.stdout.readline()
                if not line.startswith(b"build consumer ready"):
                    errors.seek(0)
                    said = errors.read()[-1500:].decode(errors="replace")
                    raise RuntimeError(f"{target.label} consumer did not start: {line!r} {said}")
            started.append(Consumer(process, port))
        yield started
    finally:
        for consumer in started:
            consumer.process.send_signal(signal.SIGTERM)
        for consumer in started:
            try:
                consumer.process.wait(30)
            except subprocess.TimeoutExpired:
                consumer.process.kill()


# ---------------------------------------------------------------------------- the generator


class Client:
    """One producer, and one reader of the reply topic that timestamps arrivals."""

    def __init__(self, bootstrap: str, reply_topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

        self.reply_topic = reply_topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all", "batch.size": 65536}
        )
        self.reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": int(os.environ["CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS"]),
            }
        )
        self.reader.assign(
            [TopicPartition(reply_topic, p, OFFSET_BEGINNING) for p in range(REPLY_PARTITIONS)]
        )
        self.arrived: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            message = self.reader.poll(0.05)  # returns as soon as one record is there
            if message is not None and message.error() is None:
                found = CID.search(message.value() or b"")
                if found:
                    self.arrived.setdefault(found.group(1), time.perf_counter())

    def close(self) -> None:
        self.producer.flush(10)
        self._stop.set()
        self._thread.join()
        self.reader.close()


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    sent: int = 0
    ids: set[bytes] = field(default_factory=set)

    @property
    def answered(self) -> int:
        return len(self.latencies)

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("inf")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    def line(self, label: str) -> str:
        lost = self.sent - self.answered
        return (
            f"{label:<34} p50 {self.percentile(0.5) * 1000:8.1f} ms  "
            f"p99 {self.percentile(0.99) * 1000:8.1f} ms  unanswered {lost}/{self.sent}"
        )

    @property
    def sustained(self) -> bool:
        return self.answered == self.sent and self.percentile(0.99) <= TARGET_P99_S


def open_loop(
    client: Client,
    topic: str,
    make: Callable[[str], bytes],
    *,
    rate: float,
    seconds: float,
    wait_s: float = 30.0,
) -> Run:
    """Send ``rate`` requests a second for ``seconds``, each due at its slot; then wait."""
    tag = uuid.uuid4().hex[:6]
    total = max(int(rate * seconds), 1)
    due: dict[bytes, float] = {}
    start = time.perf_counter() + 0.05
    for i in range(total):
        slot = start + i / rate
        while (ahead := slot - time.perf_counter()) > 0:
            time.sleep(min(ahead, 0.002))
        cid = f"{tag}-{i}"
        due[cid.encode()] = slot
        client.producer.produce(topic, make(cid), key=cid.encode())
        client.producer.poll(0)
    client.producer.flush(30)
    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline and not all(c in client.arrived for c in due):
        time.sleep(0.02)
    run = Run(sent=total)
    run.latencies = [client.arrived[c] - t for c, t in due.items() if c in client.arrived]
    run.ids = set(due)
    return run


def sequential(client: Client, topic: str, make: Callable[[str], bytes], count: int) -> Run:
    run = Run(sent=count)
    for i in range(count):
        cid = f"seq-{uuid.uuid4().hex[:8]}-{i}".encode()
        started = time.perf_counter()
        client.producer.produce(topic, make(cid.decode()), key=cid)
        client.producer.poll(0)
        client.producer.flush(10)
        while cid not in client.arrived and time.perf_counter() - started < 10:
            time.sleep(0.0002)
        if cid in client.arrived:
            run.latencies.append(client.arrived[cid] - started)
    return run


def counter(text: str, name: str) -> float:
    """The value of an unlabelled counter in one scrape (0 when absent)."""
    found = re.search(rf"^{name} ([\d.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def stage_means(before: str, after: str) -> dict[str, float]:
    """Mean seconds per observation of each stage between two scrapes of one consumer."""

    def totals(text: str) -> dict[tuple[str, str], float]:
        found: dict[tuple[str, str], float] = {}
        pattern = (
            r"contextcore_consumer_stage_seconds_(sum|count)"
            r'\{consumer="build",stage="(\w+)"\} ([\d.e+-]+)'
        )
        for kind, stage, value in re.findall(pattern, text):
            found[(kind, stage)] = float(value)
        return found

    a, b = totals(before), totals(after)
    means: dict[str, float] = {}
    for (kind, stage), value in b.items():
        if kind != "count":
            continue
        count = value - a.get(("count", stage), 0.0)
        if count > 0:
            means[stage] = (b[("sum", stage)] - a.get(("sum", stage), 0.0)) / count
    return means


# ---------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Knowledge:
    """The tenant the ``full`` workload reads: its documents' chunks and its questions."""

    org: Org
    questions: list[str]
    vectors: Any  # numpy float32 rows, one per chunk


def knowledge_for(seeded: Seeded, chunks: int) -> Knowledge:
    """``chunks`` real-derived vectors (``bench.search.tenant_vectors``) for the first seeded
    organization, and FAQ questions to ask."""
    from bench.corpora import tuning
    from bench.search import tenant_vectors

    rows = tenant_vectors(chunks)
    return Knowledge(seeded.orgs[0], [q.text for q in tuning().questions], rows)


async def store_knowledge(admin_url: str, runtime_url: str, knowledge: Knowledge) -> None:
    """The tenant's chunks, their HNSW index and twenty memories of one agent, in one
    database (ours, or the baseline's)."""
    from bench.search import seed as seed_chunks
    from contextcore.knowledge.adapters import indexes
    from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL

    admin = await asyncpg.connect(admin_url)
    try:
        await seed_chunks(admin, knowledge.org.id, knowledge.vectors, new_organization=False)
        await admin.execute(indexes.create_sql(knowledge.org.id, DEFAULT_MODEL, 384))
        await admin.execute("ANALYZE knowledge_chunks")
    finally:
        await admin.close()
    await remember_facts(runtime_url, knowledge.org)


async def remember_facts(url: str, org: Org) -> None:
    from contextcore.memory.adapters.store import PostgresMemoryJournal
    from contextcore.memory.service import MemoryService
    from contextcore.storage.pool import create_pool
    from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
    from schemas.memory import Invoker, MemoryCandidate

    pool = await create_pool(url, max_size=2, session_role=SERVICE_ROLE)
    try:
        service = MemoryService(PostgresMemoryJournal(TenantDatabase(pool)))
        invoker = Invoker(
            organization_id=org.id, definition_id=DEFINITION, user_id=org.user, trigger_id=None
        )
        for i in range(20):
            candidate = MemoryCandidate.model_validate(
                {
                    "scope": "organization" if i % 2 else "user",
                    "attribute": f"observation.fact{i}",
                    "text": f"Remembered fact number {i} about how this customer buys.",
                    "subject_refs": [],
                }
            )
            await service.remember(invoker, candidate, f"bench-{i}")
    finally:
        await pool.close()


def request_maker(
    orgs: list[Org], reply_topic: str, workload: str, knowledge: Knowledge | None = None
) -> Callable[[str], bytes]:
    """Requests for random seeded organizations: ``typical`` (two refs, the demo's policy),
    ``heavy`` (ten refs, the policy of bench/sources.py), ``full`` (the typical turn with a
    question, all seven sources, on the tenant with documents and memories), or ``empty`` (no
    source: the transport alone). ``+explain`` (``typical+explain``) asks each for its manifest
    (``explain: true``)."""
    rng = random.Random(11)
    workload, _, flag = workload.partition("+")
    explain = flag == "explain"
    policies = {"typical": TYPICAL_POLICY, "heavy": POLICY, "full": FULL_POLICY}
    policy = policies[workload].model_dump(mode="json") if workload in policies else {"sources": []}

    def make(correlation_id: str) -> bytes:
        if workload == "full":
            assert knowledge is not None
            turn = request_for(knowledge.org, rng, typical=True)
            turn = turn.model_copy(
                update={
                    "query": rng.choice(knowledge.questions),
                    "subject": turn.subject.model_copy(update={"definition_id": DEFINITION}),
                }
            )
            request = turn.model_dump(mode="json")
        else:
            org = rng.choice(orgs)
            request = request_for(org, rng, typical=workload != "heavy").model_dump(mode="json")
        message = {
            "schema_version": 1,
            "correlation_id": correlation_id,
            "reply_to": reply_topic,
            "request": request,
            "policy": policy,
        }
        if explain:
            message["explain"] = True
        return json.dumps(message).encode()

    return make


@dataclass
class Figures:
    lines: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)

    def add(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


@contextmanager
def fresh_step(
    target: Target, count: int, orgs: list[Org], workload: str, rate: float = 20, warm_s: float = 4
) -> Iterator[Step]:
    """New topics, a new group and ``count`` new consumer processes, warmed up: 4 s at 20
    requests a second, then 1 s at the step's ``rate``, answered before the step starts, so
    that the step measures a running consumer, not its first connections and plans (the first
    second at 200 requests a second otherwise waited up to 240 ms).

    Tansu's memory storage grows slower the longer a partition's log gets (its CPU per record
    rose from 2 ms to 9 ms within 2,500 records in one partition), so every step starts on
    empty topics, and replies spread over eight partitions.
    """
    tag = uuid.uuid4().hex[:8]
    topic = f"bench.{tag}.build-request"
    reply_prefix = f"bench.{tag}.reply"
    reply_topic = f"{reply_prefix}.generator"
    asyncio.run(
        ensure_topics(BOOTSTRAP[0], [TopicSpec(topic, 4), TopicSpec(reply_topic, REPLY_PARTITIONS)])
    )
    client = Client(BOOTSTRAP[0], reply_topic)
    make = request_maker(orgs, reply_topic, workload, KNOWLEDGE[0] if KNOWLEDGE else None)
    try:
        with consumers(target, topic, reply_prefix, count) as running:
            for warm_rate, seconds in ((20.0, warm_s), (rate, 1.0)):
                warm = open_loop(client, topic, make, rate=warm_rate, seconds=seconds, wait_s=60)
                if warm.answered < warm.sent:
                    raise RuntimeError(f"{target.label}: the warm-up was not answered")
            settle_group(running, legacy=target.legacy)
            yield Step(client, topic, make, running)
    finally:
        client.close()


def settle_group(running: list[Consumer], *, legacy: bool) -> None:
    """Wait until every member holds partitions (this code reports them in /metrics); the
    earlier code cannot tell, so it gets the time a Tansu group join takes."""
    if legacy:
        time.sleep(6 if len(running) > 1 else 0)
        return
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        held = [
            c.metrics().count("contextcore_consumer_oldest_in_flight_age_seconds{") for c in running
        ]
        if all(held) and sum(held) == 4:
            return
        time.sleep(0.5)
    raise RuntimeError("the consumer group did not settle")


@dataclass
class Step:
    client: Client
    topic: str
    make: Callable[[str], bytes]
    running: list[Consumer]

    def scrape(self, legacy: bool) -> list[str]:
        return ["" if legacy else consumer.metrics() for consumer in self.running]


def measure(target: Target, orgs: list[Org], args: argparse.Namespace, workload: str) -> Figures:
    figures = Figures()
    figures.add(f"== {target.label}, workload {workload}")
    with fresh_step(target, 1, orgs, workload, warm_s=args.warm_up) as step:
        seq = sequential(step.client, step.topic, step.make, args.sequential)
        figures.add(seq.line("sequential round trip"))
        figures.values["sequential_p50"] = seq.percentile(0.5)
        figures.values["sequential_p99"] = seq.percentile(0.99)

    def one(count: int, rate: float, label: str, *, record: bool = False) -> Run:
        with fresh_step(target, count, orgs, workload, rate, args.warm_up) as step:
            cpu, before = cpu_seconds(), step.scrape(target.legacy)
            run = open_loop(step.client, step.topic, step.make, rate=rate, seconds=args.seconds)
            figures.add(run.line(label))
            used = cpu_per_request(cpu, cpu_seconds(), run.sent)
            figures.add(cpu_line(used))
            if record:  # the fixed-rate steps: the figures the summary compares
                for name, ms in used.items():
                    figures.values[f"cpu_{name}@{rate:g}"] = ms / 1000
                scraped = "" if target.legacy else step.running[0].metrics()
                if RT in scraped:  # code before issue 20 does not count them
                    trips = counter(scraped, RT) - counter(before[0], RT)
                    figures.values[f"round_trips@{rate:g}"] = trips / max(run.sent, 1)
                    figures.add(f"  database round trips per request: {trips / run.sent:.2f}")
            for index, consumer in enumerate(step.running):
                rss = consumer.peak_rss_mb()
                figures.values[f"rss@{count}.{index}"] = max(
                    rss, figures.values.get(f"rss@{count}.{index}", 0.0)
                )
                if not target.legacy:
                    means = stage_means(before[index], consumer.metrics())
                    figures.add(
                        f"  consumer {index}: peak RSS {rss:.0f} MB; mean per stage: "
                        + ", ".join(f"{s} {v * 1000:.2f} ms" for s, v in sorted(means.items()))
                    )
                else:
                    figures.add(f"  consumer {index}: peak RSS {rss:.0f} MB")
        return run

    for rate in args.rates:
        run = one(1, rate, f"{rate:g} req/s, 1 process", record=True)
        figures.values[f"p50@{rate:g}"] = run.percentile(0.5)
        figures.values[f"p99@{rate:g}"] = run.percentile(0.99)
    for count in args.processes:
        best = 0.0
        for rate in args.ladder:  # lowest first; stop at the first rate not sustained
            if not one(count, rate, f"ladder {rate:g} req/s, {count} process(es)").sustained:
                break
            best = rate
        figures.add(f"max sustainable (p99 <= 100 ms), {count} process(es): {best:g} req/s")
        figures.values[f"max@{count}"] = best
    return figures


async def baseline_database(code_dir: Path, seeded: Seeded, name: str) -> str:
    """A database migrated by the baseline's own migrations and seeded like ours."""
    stack = seeded.stack
    await drop(stack, name)
    await provision_database(stack.admin_url, name, owner=OWNER)
    admin_url = with_database(stack.admin_url, name)
    migrate = (
        "import asyncio, asyncpg, sys\n"
        "from contextcore.storage import migrations\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    await migrations.apply_pending(conn)\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
    )
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", migrate, admin_url],
        cwd=code_dir,
        env={**os.environ, "PYTHONPATH": str(code_dir)},
        check=True,
    )
    conn = await asyncpg.connect(admin_url)
    try:
        await seed(conn, seeded.orgs)
    finally:
        await conn.close()
    if KNOWLEDGE:
        await store_knowledge(admin_url, admin_url, KNOWLEDGE[0])
    return admin_url  # the baseline knew one credential: it served as the table owner


def against_transport(
    label: str, by_workload: dict[str, Figures], args: argparse.Namespace
) -> None:
    """Each workload beside the first (the transport alone) of the same run: the figures of
    issue 20's targets and their ratios."""
    names = list(by_workload)
    base = by_workload[names[0]].values
    rate = f"{args.rates[-1]:g}"
    print(f"== {label}: each workload against {names[0]}, same run")
    rows = [
        ("max rate, p99 <= 100 ms, 1 process", "max@1", "req/s", 1.0, "ratio"),
        (f"p99 at {rate} req/s", f"p99@{rate}", "ms", 1000.0, "ratio"),
        (
            f"consumer CPU per request at {rate} req/s",
            f"cpu_consumers@{rate}",
            "ms",
            1000.0,
            "ratio",
        ),
        (
            f"PostgreSQL CPU per request at {rate} req/s",
            f"cpu_postgres@{rate}",
            "ms",
            1000.0,
            "ratio",
        ),
        ("sequential p50", "sequential_p50", "ms", 1000.0, "difference"),
        (f"database round trips per request at {rate} req/s", f"round_trips@{rate}", "", 1.0, ""),
    ]
    for name in names[1:]:
        values = by_workload[name].values
        print(f"-- {name}")
        for title, key, unit, scale, compare in rows:
            if key not in values:
                continue
            mine, theirs = values[key] * scale, base.get(key, 0.0) * scale
            line = f"{title:<48} {mine:9.2f} {unit:<5} ({names[0]} {theirs:.2f})"
            if compare == "ratio" and theirs:
                line += f"  ratio {mine / theirs:.2f}"
            elif compare == "difference":
                line += f"  difference {mine - theirs:+.2f} ms"
            print(line)
        for key in sorted(values):
            if key.startswith("rss@"):
                print(f"{'peak RSS, consumer ' + key[4:]:<48} {values[key]:9.0f} MB")


SMOKE = {
    "organizations": 2,
    "seconds": 1.0,
    "sequential": 10,
    "rates": [20.0],
    "ladder": [20.0],
    "processes": [2],
    "warm_up": 1.0,
}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py): each step
(sequential, a fixed rate, the ladder, with two processes) of each workload, one rate each."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier commit")
    parser.add_argument(
        "--baseline-last", action="store_true", help="measure the baseline after this code"
    )
    parser.add_argument("--organizations", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=10_000, help="the full workload's tenant")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument(
        "--workloads",
        type=lambda s: s.split(","),
        default=["empty", "typical"],
        help="measured one after the other in this run, each against the first (the transport "
        "alone, 'empty'): typical, heavy, full; a +explain suffix asks for the manifest",
    )
    parser.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=TANSU_FETCH_MAX_WAIT_MS,
        help="the consumers' and the generator's fetch long poll (Tansu holds it to its end)",
    )
    parser.add_argument(
        "--processes",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[1, 2],
        help="consumer processes of the ladders",
    )
    parser.add_argument("--in-flight", type=int, default=None, help="this code's max in flight")
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",") if x], default=[50, 200]
    )
    parser.add_argument(
        "--ladder",
        type=lambda s: [float(x) for x in s.split(",") if x],
        default=[50 * step for step in range(1, 21)],
    )
    parser.add_argument(
        "--warm-up", type=float, default=4.0, help="seconds at 20 requests/s before each step"
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    name = database_name("bench_e2e", args.smoke)

    seeded = asyncio.run(prepare(name, args.organizations))
    BOOTSTRAP.append(seeded.stack.bootstrap_servers)
    if "full" in args.workloads:
        KNOWLEDGE.append(knowledge_for(seeded, args.chunks))
        asyncio.run(store_knowledge(seeded.admin_url, seeded.url, KNOWLEDGE[0]))
        print(f"seeded {args.chunks:,} chunks, their index and 20 memories for one organization")
    os.environ["CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS"] = str(args.fetch_wait_ms)
    if args.in_flight is not None:
        os.environ["CONTEXTCORE_BUILD_MAX_IN_FLIGHT"] = str(args.in_flight)
    print(
        f"workloads {', '.join(args.workloads)}, fetch wait {args.fetch_wait_ms} ms, "
        f"{args.organizations} organizations, {args.seconds:g} s per step"
    )
    targets = [Target("this code", ROOT, seeded.url, legacy=False)]
    if args.baseline is not None:
        url = asyncio.run(baseline_database(args.baseline.resolve(), seeded, "bench_e2e_baseline"))
        code = args.baseline.resolve()
        settings = code / "consumers" / "build" / "settings.py"
        legacy = not settings.exists() or "CONTEXTCORE_BUILD_" not in settings.read_text()
        baseline = Target(f"baseline {args.baseline}", code, url, legacy)
        if args.baseline_last:  # the later target meets a broker that has carried more
            targets.append(baseline)
        else:
            targets.insert(0, baseline)
    results: list[Figures] = []
    try:
        for target in targets:
            by_workload = {w: measure(target, seeded.orgs, args, w) for w in args.workloads}
            results.append(by_workload[args.workloads[-1]])
            against_transport(target.label, by_workload, args)
    finally:
        asyncio.run(drop(seeded.stack, name))
        if args.baseline is not None:
            asyncio.run(drop(seeded.stack, "bench_e2e_baseline"))
    if len(results) == 2:
        before, after = (results[1], results[0]) if args.baseline_last else results
        base, new = before.values, after.values
        print("== this code against the baseline, same run")
        for key in sorted(new):
            if base.get(key):
                print(
                    f"{key:<18} baseline {base[key]:10.4g}   this code {new[key]:10.4g}   "
                    f"ratio {new[key] / base[key]:6.2f}"
                )


if __name__ == "__main__":
    main()
