"""Fair shares under noisy neighbours (issue 33): each scenario runs a victim organization B
alone, then beside organization A's flood, in one run, and prints both and their ratio.

    python -m bench.fairness [--only erasure|ingestion|builds|interactive|huge] [--smoke]
                             [--seconds 8] [--revisions 10000] [--rate 50] [--documents 5000]
                             [--capacity-seconds 5] [--ingest-documents 2000]
                             [--sections 100000] [--flood 3] [--quota-share 0.25]
                             [--flood-idle]

Without ``--only``, every scenario, in this order. ``--smoke`` (or ``--quick``) shrinks every
size and wait (every scenario in seconds, as tests/integration/test_bench_smoke.py runs it; its
figures mean little); a size given beside it wins.

* ``erasure``: A's operator erases one user's ``--revisions`` memories (each written through the
  memory service, so each has its journal row) while B's agents write memories at ``--rate``
  calls/s through a running memory consumer (its own process, the real broker) and read another
  B user's 200 memories through the memory source (20/s: a user whose memories the run does
  not change, so the reads compare like with like); A's agents keep writing too (10/s), so A's
  writes share batches with B's. Target: B's write p99 beside the erasure at most 2x B's p99
  alone; B's reads likewise. Prints how long the erasure held A's lock, and the memory
  consumer's peak RSS.

* ``ingestion``: A uploads ``--documents`` one-passage documents at once through its
  ``KnowledgeClient`` (B has its own) to a running upload consumer and embedding consumer
  (their own processes); ``--delay`` (10) s later B uploads one document, three times in a row. B's
  upload-to-``ready`` alone and beside A's flood; A's documents per second alone and beside B.
  Target: B beside at most twice B alone plus the longest single encode of the flood (printed:
  an encode of as many of the flood's passages as one encode merges, on this machine, with the
  consumers stopped); A's rate beside at least 0.9 of A's alone. Also printed: the encodes
  that ran while B's uploads did (the embedding consumer's ``contextcore_embed_encode_seconds``),
  and B against the same bound with the longest of them at the speed it ran beside the flood.

* ``builds`` (target 2): first what one build consumer process sustains: A's typical builds
  (the demo's five sources), 32 always waiting, for ``--capacity-seconds``, on a consumer of its
  own. Then A gets the quota ``build_rate`` of half that (and ``build_burst`` one second's
  worth: ``contextcore quota``, set before the next consumer starts, as it keeps quotas 5 s), so
  that A's admitted builds and B's fit in one process. On a fresh consumer, B sends 10 typical
  builds a second for ``--seconds`` alone, then beside A's flood at three times the sustained
  rate (``--flood``), sent by A's own client in a process of its own (as a tenant's service is).
  Target: B's p99 beside at most 2x alone, every request of B's answered; A's excess answered at
  once ``throttled`` with ``retry_after_ms``, and counted per organization in the consumer's
  ``contextcore_build_throttled_total`` (printed from its /metrics). Then a control: B beside
  processes that burn as much CPU as the flood added and send nothing, so the ratio beside the
  flood reads against what that much CPU taken costs B whoever takes it.

* ``interactive`` (target 3): B's builds at 20/s for ``--seconds`` alone, then beside A's ingest
  of ``--ingest-documents`` one-passage documents through an upload consumer and an embedding
  consumer at their default priority (nice 10, SCHED_IDLE), all on this machine, the build
  consumer at nice 0; A's client in a process of its own. Twice: with B's typical policy, and
  with the knowledge source added (over B's own 20 documents, each build a new question, so
  each encodes its query). B's phases beside start once A's first document is ready. Target:
  B's build p99 beside at most 2x alone. Prints the ingest's documents per second during each
  phase beside, and where each phase's time went: each process's CPU and run-queue wait, the
  build consumer's own timings of its records and source reads (its /metrics), and how late
  the bench's own event loop woke.

* ``huge`` (target 4): A uploads one Markdown document of ``--sections`` short sections (100,000:
  about 3.5 MB) by reference, through the upload consumer's file root (it does not fit a record);
  ``--delay`` (10) s later B uploads a one-chunk document, three times in a row. B's
  upload-to-``ready`` alone (before A's upload) and beside; what became of A's document: the
  upload consumer's chunk limit (``CONTEXTCORE_UPLOAD_MAX_DOCUMENT_CHUNKS``, 10,000) should fail
  it, with the reason, before any chunk is stored (printed: its status and reason, the seconds to
  them, A's chunks stored). Target: B beside at most twice B alone plus the longest single encode
  of the flood (as many of A's sections as one encode merges).

Prints figures; never passes or fails. CPU flags beside the figures (they differ between
machines; compare the ratios of one run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import random
import re
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Literal, TypeVar

import asyncpg

from admin.quotas import set_quotas
from bench.corpora import CACHE
from bench.e2e import Consumer, free_port
from bench.processes import (
    burning,
    busy_since,
    machine_busy_seconds,
    peak_rss_mb,
    priority,
    runqueue_wait_seconds,
    start_consumer,
    tree_cpu_seconds,
)
from bench.seeded import (
    FULL_POLICY,
    TYPICAL_POLICY,
    Org,
    database_name,
    drop,
    prepare,
    request_for,
    seed,
)
from broker.settings import TopicSettings
from broker.topics import (
    TopicSpec,
    build_topics,
    delete_topics,
    ensure_topics,
    memory_topics,
    upload_topics,
)
from contextcore.memory.adapters.erasure import erase
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService
from contextcore.sources.memory import MemoryContextSource
from contextcore.storage.pool import create_pool
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.client import ContextClient
from producers.knowledge import KnowledgeClient, UploadFailed
from producers.memory import MemoryClient
from producers.staging import FileStage
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject
from schemas.errors import ReplyTimeout
from schemas.memory import Invoker, MemoryCandidate
from schemas.upload import UploadStatusV1


def cpu_flags() -> str:
    """The CPU flags that change an encoder's or a database's speed, as /proc/cpuinfo says."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith("flags")), "").split()
    except OSError:
        return "unknown"
    wanted = ("amx_tile", "avx512_bf16", "avx512f", "avx2")
    return ", ".join(f for f in wanted if f in flags) or "none of amx, avx512, avx2"


@dataclass
class Latencies:
    """Milliseconds of the calls of one phase."""

    label: str
    values: list[float]

    def quantile(self, q: float) -> float:
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")

    def line(self) -> str:
        return (
            f"{self.label}: {len(self.values)} calls, p50 {self.quantile(0.5):,.1f} ms, "
            f"p90 {self.quantile(0.9):,.1f} ms, p99 {self.quantile(0.99):,.1f} ms, "
            f"max {max(self.values, default=0):,.1f} ms"
        )


async def paced(
    rate: float, until: Callable[[], bool], call: Callable[[int], Awaitable[None]]
) -> list[tuple[float, float]]:
    """Start ``call(i)`` every 1/``rate`` s (on schedule, whatever the earlier ones take) until
    ``until()``; each call's (start, milliseconds), once all finished."""
    timings: list[tuple[float, float]] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        await call(i)
        timings.append((started, (time.perf_counter() - started) * 1000))

    tasks: list[asyncio.Task[None]] = []
    began = time.perf_counter()
    i = 0
    while not until():
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(max(0.0, began + i / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    return timings


def between(timings: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [ms for at, ms in timings if start <= at <= end]


def deadline(seconds: float) -> Callable[[], bool]:
    """``paced``'s ``until``: true once ``seconds`` have passed from now."""
    until = time.perf_counter() + seconds
    return lambda: time.perf_counter() > until


def p99_ratio(alone: Latencies, beside: Latencies) -> str:
    """Issue 33's figure for calls: B's p99 beside the flood over B's p99 alone."""
    ratio = beside.quantile(0.99) / alone.quantile(0.99)
    return f"  ratio, B's p99 beside / alone: {ratio:.2f} (target <= 2)"


# ---------------------------------------------------------------------------------- erasure


async def seed_revisions(pool: asyncpg.Pool, who: Invoker, count: int) -> None:
    """``count`` memories of one user, each through the memory service (a journal row each)."""
    service = MemoryService(PostgresMemoryJournal(TenantDatabase(pool)), concurrency=2)
    slots = asyncio.Semaphore(256)

    async def one(i: int) -> None:
        async with slots:
            candidate = MemoryCandidate(
                scope="user", attribute=f"observation.fact{i}", text=f"a fact about A's user {i}"
            )
            await service.remember(who, candidate, f"seed-{i}")

    await asyncio.gather(*(one(i) for i in range(count)))


B_MEMORIES = 200
"""Memories of the B user whose memory-source reads ``erasure`` times."""


async def erasure(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    a, b, definition = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    a_user, b_user, b_reader = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(a, "A"), (b, "B")]
    )
    pool = await create_pool(url, min_size=2, max_size=4, session_role=SERVICE_ROLE)
    started = time.perf_counter()
    await seed_revisions(
        pool, Invoker(organization_id=a, definition_id=definition, user_id=a_user), args.revisions
    )
    # B's reads are of a user whose memories do not change: a read of the writer's own grew
    # with its chains (each write appends a revision the read skips), so the later phase read
    # more rows and looked slower with no erasure at all
    await seed_revisions(
        pool, Invoker(organization_id=b, definition_id=definition, user_id=b_reader), B_MEMORIES
    )
    await admin.execute("ANALYZE memories, memory_writes")
    print(
        f"  seeded {args.revisions:,} revisions of A's user and {B_MEMORIES} of B's reader, each "
        f"with its journal row, in {time.perf_counter() - started:.0f} s"
    )
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        memory_write=f"bench.{tag}.memory-write",
        memory_write_partitions=2,
        reply_prefix=f"bench.{tag}.reply",
    )
    await ensure_topics(args.bootstrap, memory_topics(topics))
    consumer = start_consumer(
        "memory",
        {
            **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
            "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
            "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": "50",
            "CONTEXTCORE_DATABASE_URL": url,
            "CONTEXTCORE_TOPIC_MEMORY_WRITE": topics.memory_write,
            "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
            "CONTEXTCORE_MEMORY_GROUP_ID": f"bench-{tag}-memory",
            "CONTEXTCORE_MEMORY_METRICS_PORT": "0",
        },
    )
    client = MemoryClient(
        bootstrap_servers=args.bootstrap,
        memory_topic=topics.memory_write,
        reply_topic_prefix=topics.reply_prefix,
        fetch_max_wait_ms=20,
    )
    await client.start()
    source = MemoryContextSource(TenantDatabase(pool))
    spec = ContextSourceSpec(name="memory", token_budget=4000)
    b_writer = Invoker(organization_id=b, definition_id=definition, user_id=b_user)
    a_writer = Invoker(organization_id=a, definition_id=definition, user_id=uuid.uuid4())
    read = ContextRequest(
        subject=ContextSubject(
            organization_id=b, user_id=b_reader, trigger_id=None, definition_id=definition
        ),
        query="",
        entities=(),
    )
    counter = iter(range(10**9))

    def writer(
        who: Invoker, scope: Literal["user", "organization"], name: str, keys: int
    ) -> Callable[[int], Awaitable[None]]:
        """One remember call of ``who``'s, on one of ``keys`` attributes in turn."""

        async def write(i: int) -> None:
            n = next(counter)
            candidate = MemoryCandidate(
                scope=scope, attribute=f"observation.{name}{n % keys}", text=f"{name}'s fact {n}"
            )
            answer = await client.remember(who, candidate, timeout=120)
            assert answer.status == "written", answer

        return write

    b_write = writer(b_writer, "user", "b", 200)
    a_write = writer(a_writer, "organization", "a", 50)

    async def b_read(i: int) -> None:
        await source.retrieve(read, spec)

    try:
        # warm-up: the consumer's group, the reply topic, the pool's statements
        warm_until = time.perf_counter() + 3
        await asyncio.gather(
            paced(args.rate, lambda: time.perf_counter() > warm_until, b_write),
            paced(10, lambda: time.perf_counter() > warm_until, a_write),
        )
        # B alone (A's agents writing at 10/s, no erasure)
        alone_until = time.perf_counter() + args.seconds
        writes_alone, _, reads_alone = await asyncio.gather(
            paced(args.rate, lambda: time.perf_counter() > alone_until, b_write),
            paced(10, lambda: time.perf_counter() > alone_until, a_write),
            paced(20, lambda: time.perf_counter() > alone_until, b_read),
        )
        # B beside A's erasure: it starts a second in, B goes on a second after it ends
        ends: list[float] = []
        window: list[float] = []

        def over() -> bool:
            return bool(ends) and time.perf_counter() > ends[0] + 1

        async def run_erasure() -> None:
            await asyncio.sleep(1)
            owner = await asyncpg.connect(owner_url)
            try:
                window.append(time.perf_counter())
                erased = await erase(owner, a, "user", str(a_user), apply=True)
                window.append(time.perf_counter())
            finally:
                await owner.close()
            ends.append(time.perf_counter())
            print(
                f"  A's erasure: {erased.revisions:,} revisions, {erased.journal_rows:,} journal "
                f"rows, {(window[1] - window[0]) * 1000:,.0f} ms (its lock held, then VACUUM)"
            )

        writes_beside, a_beside, reads_beside, _ = await asyncio.gather(
            paced(args.rate, over, b_write),
            paced(10, over, a_write),
            paced(20, over, b_read),
            run_erasure(),
        )
        during_writes = Latencies("B's writes during the erasure", between(writes_beside, *window))
        alone = Latencies("B's writes alone", [ms for _, ms in writes_alone])
        during_reads = Latencies("B's memory reads during it", between(reads_beside, *window))
        reads = Latencies("B's memory reads alone", [ms for _, ms in reads_alone])
        a_during = Latencies("A's own writes during it (they wait)", between(a_beside, *window))
        for line in (alone, during_writes, reads, during_reads, a_during):
            print("  " + line.line())
        print(
            f"  ratio, B's write p99 beside / alone: "
            f"{during_writes.quantile(0.99) / alone.quantile(0.99):.2f} (target <= 2); "
            f"B's read p99: {during_reads.quantile(0.99) / reads.quantile(0.99):.2f} (target <= 2)"
        )
        print(f"  memory consumer peak RSS: {peak_rss_mb(consumer.pid):.0f} MB (target < 300)")
    finally:
        await client.close()
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(60)
        await pool.close()


# -------------------------------------------------------------------------------- ingestion

ENCODE_MERGES = 64
"""Passages one encode of the embedding group merges at most (its CoalescingEncoder)."""


def knowledge_client(bootstrap: str, topics: TopicSettings) -> KnowledgeClient:
    """An organization's own client of the upload topic (each tenant has its own: its uploads
    and statuses never queue behind another's in one producer or one reply topic)."""
    return KnowledgeClient(
        bootstrap_servers=bootstrap,
        upload_topic=topics.upload,
        reply_topic_prefix=topics.reply_prefix,
        fetch_max_wait_ms=20,
        max_in_flight=1_000,
    )


class StagedClient(KnowledgeClient):
    """A client that notes when each upload's first status came: ``pending``, the upload
    consumer done with it and its batches on the embedding topic (the ``ready`` that ends it
    comes from the embedding group)."""

    def __init__(self, bootstrap: str, topics: TopicSettings) -> None:
        super().__init__(
            bootstrap_servers=bootstrap,
            upload_topic=topics.upload,
            reply_topic_prefix=topics.reply_prefix,
            fetch_max_wait_ms=20,
            max_in_flight=1_000,
        )
        self.first_status: dict[str, float] = {}

    def _on_reply(self, value: bytes, offset: int) -> None:
        arrived = time.perf_counter()
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.first_status.setdefault(json.loads(value)["correlation_id"], arrived)
        super()._on_reply(value, offset)

    async def staged(self, organization: uuid.UUID, text: str, n: int) -> tuple[float, float]:
        """Milliseconds from the upload of ``text`` to its first status, and to ``ready``."""
        started = time.perf_counter()
        status = await upload_numbered(self, organization, text, n)
        first = self.first_status.pop(status.correlation_id, math.nan)
        return (first - started) * 1000, (time.perf_counter() - started) * 1000


async def upload_numbered(
    client: KnowledgeClient, organization: uuid.UUID, text: str, n: int
) -> UploadStatusV1:
    """``text`` uploaded as document ``n`` of ``organization``; its ``ready`` status (a failed
    or rejected upload raises)."""
    return await client.upload(
        organization_id=organization,
        title=f"doc {n}",
        media_type="text/plain",
        uri=f"bench://{n}",
        content=text,
        timeout=3_600,
    )


async def upload_text(client: KnowledgeClient, organization: uuid.UUID, text: str, n: int) -> float:
    """Milliseconds from the upload of ``text``, document ``n`` of ``organization``, to its
    ``ready``."""
    started = time.perf_counter()
    await upload_numbered(client, organization, text, n)
    return (time.perf_counter() - started) * 1000


def longest_encode_ms(passages: list[str]) -> float:
    """One encode of ``passages`` (as many as one encode merges) with the embedding group's
    encoder, OpenVINO, warmed up, on this machine: the longest another organization's batch
    can wait behind a flood's encode once its own turn comes. Run with the consumers stopped."""
    from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, SentenceTransformerEncoder
    from contextcore.knowledge.adapters.settings import KnowledgeSettings

    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = SentenceTransformerEncoder(
        DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
    )
    encoder.encode(passages)  # warm
    started = time.perf_counter()
    encoder.encode(passages)
    return (time.perf_counter() - started) * 1000


@dataclass(frozen=True)
class Encodes:
    """The embedding consumer's model calls between two scrapes of its /metrics
    (``contextcore_embed_encode_seconds``): how many, and the bucket of the longest, as the
    calls ran, beside everything else on the machine."""

    count: float
    longest_s: tuple[float, float]
    """The longest call's bucket: over its first bound, at most its second."""
    median_s: float
    """The upper bound of the median call's bucket."""

    @classmethod
    def between(cls, before: str, after: str) -> Encodes:
        buckets = [
            (le, after_n - before_n) for le, after_n, before_n in _encode_buckets(before, after)
        ]
        count = buckets[-1][1] if buckets else 0.0
        if not count:
            return cls(0.0, (0.0, 0.0), 0.0)
        at = next(i for i, (_, n) in enumerate(buckets) if n >= count)
        longest = (buckets[at - 1][0] if at else 0.0, buckets[at][0])
        return cls(count, longest, next(le for le, n in buckets if n >= count / 2))


def _encode_buckets(before: str, after: str) -> list[tuple[float, float, float]]:
    """(upper bound, cumulative count after, before) of each bucket, in order."""
    from prometheus_client.parser import text_string_to_metric_families

    def cumulative(scrape: str) -> dict[float, float]:
        found: dict[float, float] = {}
        for family in text_string_to_metric_families(scrape):
            for sample in family.samples:
                if sample.name == "contextcore_embed_encode_seconds_bucket":
                    le = float(sample.labels["le"])
                    found[le] = found.get(le, 0.0) + sample.value
        return found

    was, now = cumulative(before), cumulative(after)
    return [(le, now[le], was.get(le, 0.0)) for le in sorted(now)]


def against_bound(alone: Latencies, beside: Latencies, longest: float) -> str:
    """B's uploads beside the flood against issue 33's bound for them: twice B alone (its
    median) plus the longest single encode of the flood."""
    bound = 2 * alone.quantile(0.5) + longest
    return (
        f"  the longest single encode of the flood ({ENCODE_MERGES} passages, OpenVINO): "
        f"{longest:,.0f} ms\n"
        f"  B beside, worst: {max(beside.values):,.0f} ms against the bound 2 x alone + one "
        f"encode = {bound:,.0f} ms (ratio to B alone, median: "
        f"{beside.quantile(0.5) / alone.quantile(0.5):.1f})"
    )


async def ingestion(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    from bench.ingest import passages

    a, b = uuid.uuid4(), uuid.uuid4()
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(a, "A"), (b, "B")]
    )
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        upload=f"bench.{tag}.upload",
        upload_partitions=2,
        embed=f"bench.{tag}.embed",
        embed_partitions=2,
        memory_write=f"bench.{tag}.memory-write",
        reply_prefix=f"bench.{tag}.reply",
    )
    await ensure_topics(args.bootstrap, upload_topics(topics))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "CONTEXTCORE_UPLOAD_FETCH_MAX_WAIT_MS": "100",
        "CONTEXTCORE_EMBED_FETCH_MAX_WAIT_MS": "100",
        "CONTEXTCORE_DATABASE_URL": url,
        "CONTEXTCORE_TOPIC_UPLOAD": topics.upload,
        "CONTEXTCORE_TOPIC_EMBED": topics.embed,
        "CONTEXTCORE_TOPIC_MEMORY_WRITE": topics.memory_write,
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_UPLOAD_GROUP_ID": f"bench-{tag}-upload",
        "CONTEXTCORE_UPLOAD_METRICS_PORT": "0",
        "CONTEXTCORE_EMBED_GROUP_ID": f"bench-{tag}-embed",
        "CONTEXTCORE_EMBED_METRICS_PORT": "0",
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
        # the lanes alone: the consumers' lower CPU priority is for builds beside them
        "CONTEXTCORE_UPLOAD_NICE": "0",
        "CONTEXTCORE_EMBED_NICE": "0",
        "CONTEXTCORE_UPLOAD_CPU_POLICY": "normal",
        "CONTEXTCORE_EMBED_CPU_POLICY": "normal",
    }
    # the held-out passages (4,500); the flood reuses them past that, each upload a document
    texts = [text.decode() for _, text in passages(args.documents + 20, 2 if args.smoke else None)]
    flood = [texts[i % (len(texts) - 20)] for i in range(args.documents)]
    own = texts[-20:]
    embed_port = free_port()
    env["CONTEXTCORE_EMBED_METRICS_PORT"] = str(embed_port)
    upload = start_consumer("upload", env)
    embed = start_consumer("embed", env)
    scrape = Consumer(embed, embed_port).metrics
    ran: list[Encodes] = []
    # each organization its own client, as tenants are, and A's in a process of its own, as
    # another machine's would be: B's requests and replies never queue behind A's in one
    # producer, one reply topic or one event loop
    b_client = StagedClient(args.bootstrap, topics)
    await b_client.start()
    uploaded = iter(range(10**9))

    async def b_upload(text: str) -> tuple[float, float]:
        return await b_client.staged(b, text, next(uploaded))

    async def a_floods(label: str) -> tuple[float, list[tuple[float, float]]]:
        """A's documents per second, and B's three uploads' milliseconds to their first status
        and to ready (none: A alone)."""
        b_times: list[tuple[float, float]] = []
        with spawned(ingest_main, IngestJob(args.bootstrap, topics, a, flood)) as (channel, _):
            if await asyncio.to_thread(channel.recv) != "started":
                raise RuntimeError("A's flood did not start")
            if label == "beside":
                await asyncio.sleep(args.delay)
                before = await asyncio.to_thread(scrape)
                for text in own[3:6]:
                    b_times.append(await b_upload(text))
                ran.append(Encodes.between(before, await asyncio.to_thread(scrape)))
            message = await asyncio.to_thread(channel.recv)
            while message == "first":
                message = await asyncio.to_thread(channel.recv)
            _, seconds = message
        return args.documents / seconds, b_times

    try:
        for text in own[:3]:  # warm-up: the encoder loads, the groups settle
            await b_upload(text)
        b_alone = [await b_upload(text) for text in own[6:12]]
        a_alone, _ = await a_floods("alone")
        a_beside, b_beside = await a_floods("beside")
        rss = {"upload": peak_rss_mb(upload.pid), "embed": peak_rss_mb(embed.pid)}
    finally:
        await b_client.close()
        for process in (upload, embed):
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    longest = longest_encode_ms(flood[:ENCODE_MERGES])
    alone = Latencies("B's upload to ready alone", [ready for _, ready in b_alone])
    beside = Latencies("B's upload to ready beside A's flood", [ready for _, ready in b_beside])
    print("  " + alone.line())
    print("  " + beside.line())
    for label, times in (("alone", b_alone), ("beside", b_beside)):
        parts = ", ".join(f"{first:,.0f} + {ready - first:,.0f}" for first, ready in times)
        print(f"  B {label}, ms to pending (the upload consumer) + to ready (embedding): {parts}")
    print(against_bound(alone, beside, longest))
    for encodes in ran:
        low, high = (bound * 1000 for bound in encodes.longest_s)
        bound = 2 * alone.quantile(0.5) + low
        print(
            f"  the encodes while B's uploads ran beside, as they ran (the embedding consumer's "
            f"/metrics): {encodes.count:,.0f}, median <= {encodes.median_s * 1000:,.0f} ms, the "
            f"longest over {low:,.0f} and at most {high:,.0f} ms; B's worst against 2 x alone + "
            f"that encode (at its least): {max(beside.values):,.0f} ms against {bound:,.0f} ms "
            f"(the encode at its speed beside the flood on two shared cores, not alone)"
        )
    print(
        f"  A's {args.documents:,} documents: {a_alone:.1f}/s alone, {a_beside:.1f}/s beside B "
        f"({a_beside / a_alone:.2f} of alone; target >= 0.9)"
    )
    print(
        f"  peak RSS: upload consumer {rss['upload']:.0f} MB, "
        f"embedding consumer {rss['embed']:.0f} MB (targets < 300, < 1,536)"
    )


# ------------------------------------------------------------ shared by the three scenarios below


@contextlib.asynccontextmanager
async def fresh_topics(
    bootstrap: str, *kinds: Callable[[TopicSettings], list[TopicSpec]]
) -> AsyncIterator[tuple[str, TopicSettings]]:
    """New topics of ``kinds`` (``build_topics``, ``upload_topics``) and their tag, deleted at
    the end (Tansu's memory storage slows down as a partition's log grows: bench/e2e.py)."""
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        build_request=f"bench.{tag}.build-request",
        upload=f"bench.{tag}.upload",
        upload_partitions=2,
        embed=f"bench.{tag}.embed",
        embed_partitions=2,
        memory_write=f"bench.{tag}.memory-write",
        reply_prefix=f"bench.{tag}.reply",
    )
    specs = [spec for kind in kinds for spec in kind(topics)]
    await ensure_topics(bootstrap, specs)
    try:
        yield tag, topics
    finally:
        await delete_topics(bootstrap, [spec.name for spec in specs])


def service_env(
    args: Namespace, url: str, tag: str, topics: TopicSettings, **settings: str
) -> dict[str, str]:
    """The consumers' environment: none of this shell's ``CONTEXTCORE_`` variables; the bench's
    broker, database (the runtime login), topics and encoder files; a group of its own per
    consumer and no metrics endpoint; then ``settings``, named without ``CONTEXTCORE_``. Every
    other setting is its default: the upload and embedding consumers' nice value is 10 and
    their CPU policy ``idle``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")}
    env |= {
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": str(TANSU_FETCH_MAX_WAIT_MS),
        "CONTEXTCORE_DATABASE_URL": url,
        "CONTEXTCORE_TOPIC_BUILD_REQUEST": topics.build_request,
        "CONTEXTCORE_TOPIC_UPLOAD": topics.upload,
        "CONTEXTCORE_TOPIC_EMBED": topics.embed,
        "CONTEXTCORE_TOPIC_MEMORY_WRITE": topics.memory_write,
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
    }
    for consumer in ("BUILD", "UPLOAD", "EMBED", "MEMORY"):
        env[f"CONTEXTCORE_{consumer}_GROUP_ID"] = f"bench-{tag}-{consumer.lower()}"
        env[f"CONTEXTCORE_{consumer}_METRICS_PORT"] = "0"
    return env | {f"CONTEXTCORE_{name}": value for name, value in settings.items()}


@contextlib.contextmanager
def running(env: dict[str, str], *consumers: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``contextcore serve`` of each of ``consumers`` in its own process, in that order, each
    ready; stopped at the end (SIGTERM: each drains what it holds)."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for consumer in consumers:
            started[consumer] = start_consumer(consumer, env)
        yield started
    finally:
        for process in started.values():
            process.send_signal(signal.SIGTERM)
        for process in started.values():
            process.wait(60)


def rss_line(started: dict[str, subprocess.Popen[bytes]]) -> str:
    """Each consumer's peak RSS (VmHWM): read while it runs."""
    peaks = (f"{name} consumer {peak_rss_mb(p.pid):,.0f} MB" for name, p in started.items())
    return "  peak RSS: " + ", ".join(peaks)


def build_client(bootstrap: str, request_topic: str, reply_prefix: str) -> ContextClient:
    """An organization's own client of the build topic (each tenant has its own: its requests
    and replies never queue behind another's in one producer or one reply topic)."""
    return ContextClient(
        request_topic=request_topic,
        bootstrap_servers=bootstrap,
        reply_topic_prefix=reply_prefix,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    )


def turns(org: Org, seed: int) -> Callable[[int], ContextRequest]:
    """The demo's turn of ``org``: a company and a deal of its own, at random."""
    rng = random.Random(seed)
    return lambda i: request_for(org, rng, typical=True)


Answer = TypeVar("Answer")


@dataclass
class Tally:
    """What one organization's build requests got: each ``ok`` reply's (start, milliseconds),
    and in how many of its briefs each source had items, or failed (an optional source that
    timed out: a brief that came in time, but poorer); each ``throttled`` reply's milliseconds
    and ``retry_after_ms`` (``None``: the reply lacked it); the other replies by error code; the
    requests no reply answered within the timeout; when the first request was sent and the last
    reply came (``perf_counter``)."""

    sent: int = 0
    ok: list[tuple[float, float]] = field(default_factory=list)
    throttled: list[tuple[float, int | None]] = field(default_factory=list)
    had: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    other: Counter[str] = field(default_factory=Counter)
    unanswered: int = 0
    first: float = math.inf
    last: float = -math.inf

    def latencies(self, label: str) -> Latencies:
        return Latencies(label, [ms for _, ms in self.ok])

    def answered_s(self) -> float:
        """Seconds from the first request to the last reply."""
        return self.last - self.first

    async def answered(self, call: Awaitable[Answer]) -> tuple[float, float, Answer] | None:
        """``call``'s answer, counted as sent: when it was sent (``perf_counter``), how many
        milliseconds it took, and the answer; ``None`` when no answer came within its timeout
        (counted unanswered)."""
        self.sent += 1
        started = time.perf_counter()
        self.first = min(self.first, started)
        try:
            answer = await call
        except ReplyTimeout:
            self.unanswered += 1
            return None
        self.last = max(self.last, time.perf_counter())
        return started, (time.perf_counter() - started) * 1000, answer

    def answers(self) -> str:
        failed = ", ".join(f"{source} {n:,}" for source, n in sorted(self.failed.items()))
        parts = [
            f"{len(self.ok):,} ok" + (f" (failed sources: {failed})" if failed else ""),
            f"{len(self.throttled):,} throttled{self._waits()}",
        ]
        parts += [f"{count:,} {code}" for code, count in sorted(self.other.items())]
        return f"{self.sent:,} sent: " + ", ".join([*parts, f"{self.unanswered:,} unanswered"])

    def _waits(self) -> str:
        """The throttled replies: how long each took to come, their ``retry_after_ms`` (its
        range) and how many lacked it."""
        if not self.throttled:
            return ""
        took = Latencies("", [ms for ms, _ in self.throttled])
        waits = sorted(wait for _, wait in self.throttled if wait is not None)
        known = f"retry_after_ms {waits[0]:,} to {waits[-1]:,}, " if waits else ""
        return (
            f" (in p50 {took.quantile(0.5):,.0f} ms, p99 {took.quantile(0.99):,.0f} ms; "
            f"{known}{len(self.throttled) - len(waits):,} without retry_after_ms)"
        )


def builder(
    client: ContextClient,
    turn: Callable[[int], ContextRequest],
    policy: ContextPolicy,
    tally: Tally,
    timeout: float,
) -> Callable[[int], Awaitable[None]]:
    """``paced``'s call: one build request of ``turn(i)`` under ``policy``, its answer counted
    in ``tally``."""

    async def build(i: int) -> None:
        answered = await tally.answered(client.request(turn(i), policy, timeout=timeout))
        if answered is None:
            return
        started, ms, reply = answered
        if reply.brief is not None:
            tally.ok.append((started, ms))
            tally.had.update(s for s, tokens in reply.brief.per_source_tokens.items() if tokens)
            tally.failed.update(reply.brief.failed_sources)
        elif reply.error is not None and reply.error.code == "throttled":
            tally.throttled.append((ms, reply.error.retry_after_ms))
        else:
            tally.other[reply.error.code if reply.error is not None else reply.status] += 1

    return build


# ----------------------------------------------------------------------------------- builds

B_BUILDS = 10.0
"""B's build requests a second in ``builds``."""
OUTSTANDING = 32
"""Requests always waiting while one process's capacity is measured: twice the build consumer's
builds at once (``max_in_flight``, 16), so that it never idles."""
FLOOD = 3.0
"""A's flood, in times what one process sustains (``--flood``; the target's figure is at 3)."""
QUOTA_SHARE = 0.25
"""A's quota ``build_rate``, in parts of what one process sustains: B's 10/s and the cost of
answering the rest of A's flood ``throttled`` fit beside it (at 0.5, measured: B's p99 946 ms,
the consumer's share of two cores that the flood's sender and the broker also use)."""
REPLY_TIMEOUT_S = 60.0
"""How long a build request waits for its reply before it counts as unanswered."""
THROTTLED = re.compile(r'^contextcore_build_throttled_total\{organization="([^"]*)"\} (\S+)$', re.M)


async def closed_loop(
    call: Callable[[int], Awaitable[None]], seconds: float, callers: int = OUTSTANDING
) -> float:
    """``callers`` callers, each calling again as soon as its call returns, until ``seconds``
    have passed; the seconds until the last call returned."""
    over = deadline(seconds)
    began = time.perf_counter()

    async def caller() -> None:
        while not over():
            await call(0)

    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - began


async def sustained(args: Namespace, url: str, org: Org) -> tuple[float, Tally]:
    """Builds a second one build consumer process answers ``ok``, with ``OUTSTANDING`` of
    ``org``'s typical builds always waiting (no quota), after a warm-up; and their answers."""
    tally = Tally()
    async with fresh_topics(args.bootstrap, build_topics) as (tag, topics):
        env = service_env(args, url, tag, topics, BUILD_PRELOAD_ENCODER="false")
        with running(env, "build"):
            async with build_client(args.bootstrap, topics.build_request, topics.reply_prefix) as c:
                turn = turns(org, 1)
                warm = builder(c, turn, TYPICAL_POLICY, Tally(), REPLY_TIMEOUT_S)
                await paced(20, deadline(3), warm)  # the group settles, the caches fill
                call = builder(c, turn, TYPICAL_POLICY, tally, REPLY_TIMEOUT_S)
                elapsed = await closed_loop(call, args.capacity_seconds)
    return len(tally.ok) / elapsed, tally


async def set_build_quota(owner_url: str, organization: uuid.UUID, rate: float) -> int:
    """The organization's ``build_rate``, and a ``build_burst`` of one second's worth (returned),
    as the operator sets them: as the schema owner."""
    burst = max(1, round(rate))
    owner = await asyncpg.connect(owner_url)
    try:
        await set_quotas(owner, organization, build_rate=rate, build_burst=burst)
    finally:
        await owner.close()
    return burst


@dataclass(frozen=True)
class Flood:
    """A's flood of typical builds, sent by a process of its own (a tenant's service is its
    own): ``rate`` requests a second for ``seconds`` from the parent's word."""

    bootstrap: str
    request_topic: str
    reply_prefix: str
    org: Org
    rate: float
    seconds: float
    idle: bool = False
    """The sender under ``SCHED_IDLE`` (``--flood-idle``): on the CPU no other process wants,
    as if it ran on a machine of its own."""


def flood_main(flood: Flood, channel: Connection) -> None:
    """The flood process: sends ``ready`` once its client is, floods at the parent's word, and
    sends back its ``Tally`` once every request is answered or timed out, with the CPU seconds
    it used from the word on."""
    if flood.idle:  # before any thread: each inherits it
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    channel.send(asyncio.run(send_flood(flood, channel)))


async def send_flood(flood: Flood, channel: Connection) -> tuple[Tally, float]:
    tally = Tally()
    async with build_client(flood.bootstrap, flood.request_topic, flood.reply_prefix) as client:
        call = builder(client, turns(flood.org, 2), TYPICAL_POLICY, tally, REPLY_TIMEOUT_S)
        channel.send("ready")
        await asyncio.to_thread(channel.recv)
        cpu = time.process_time()
        await paced(flood.rate, deadline(flood.seconds), call)
    return tally, time.process_time() - cpu


Job = TypeVar("Job")


@contextlib.contextmanager
def spawned(main: Callable[[Job, Connection], None], job: Job) -> Iterator[tuple[Connection, int]]:
    """``main(job, pipe)`` in a new interpreter (spawned: none of this one's loop or
    connections), this end of its pipe and its pid; waited for at the end (closing the pipe
    ends a child that is still waiting for a word)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=main, args=(job, theirs))
    process.start()
    theirs.close()  # the child's now: its death reads as EOFError here
    try:
        assert process.pid is not None
        yield ours, process.pid
    finally:
        ours.close()
        process.join(REPLY_TIMEOUT_S + 30)
        if process.is_alive():
            process.terminate()
            process.join()


@dataclass(frozen=True)
class Load:
    """CPU seconds the build consumer and the flood process used from the flood's start until
    its last reply (``wall_s``): on two cores, what the flood's sender took from the consumer,
    and whether the consumer had a core's worth (its event loop is one thread)."""

    consumer_cpu_s: float
    flood_cpu_s: float
    wall_s: float
    broker_cpu_s: float
    machine_busy: float
    """The share of the machine's cores busy meanwhile (1.0: every core, all the time)."""
    consumer_waited_s: float
    """The build consumer's threads' time runnable but waiting for a core."""

    def line(self) -> str:
        return (
            f"  CPU while A flooded ({self.wall_s:,.1f} s): build consumer "
            f"{self.consumer_cpu_s:,.1f} s ({self.consumer_cpu_s / self.wall_s:.2f} of a core; "
            f"{self.consumer_waited_s:,.1f} s waiting for one), "
            f"A's flood process {self.flood_cpu_s:,.1f} s, the broker {self.broker_cpu_s:,.1f} s;"
            f" the machine {self.machine_busy:.0%} busy"
        )


def pids_running(program: Callable[[bytes], bool]) -> list[int]:
    """The processes whose program (the first word of their command line) ``program`` picks."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if program((entry / "cmdline").read_bytes().split(b"\0")[0]):
                    found.append(int(entry.name))
    return found


def broker_pids() -> list[int]:
    """The dev stack's broker processes (Tansu), for their CPU; none against another broker."""
    return pids_running(lambda program: b"tansu" in program)


def postgres_pids() -> list[int]:
    """The dev stack's PostgreSQL server (its postmaster: every backend is its child); none
    against another database."""
    return pids_running(lambda program: program.endswith(b"/bin/postgres"))


def cpu_of(pids: list[int]) -> float:
    return sum(tree_cpu_seconds(pid) for pid in pids)


async def beside_flood(
    flood: Flood, call: Callable[[int], Awaitable[None]], consumer: int
) -> tuple[Tally, Load]:
    """B's ``call``, ``B_BUILDS`` a second, while A's flood runs, both from the same moment and
    for as long; A's ``Tally``, and the CPU the ``consumer`` process and the flood used."""
    with spawned(flood_main, flood) as (channel, _):
        if await asyncio.to_thread(channel.recv) != "ready":
            raise RuntimeError("the flood process did not start")
        brokers = broker_pids()
        began, cpu, broker = time.perf_counter(), tree_cpu_seconds(consumer), cpu_of(brokers)
        machine, waited = machine_busy_seconds(), runqueue_wait_seconds(consumer)
        channel.send("go")
        await paced(B_BUILDS, deadline(flood.seconds), call)
        a, flood_cpu = await asyncio.to_thread(channel.recv)
    used = tree_cpu_seconds(consumer) - cpu
    wall = time.perf_counter() - began
    waited = runqueue_wait_seconds(consumer) - waited
    return a, Load(used, flood_cpu, wall, cpu_of(brokers) - broker, busy_since(machine), waited)


@dataclass
class BuildPhases:
    """B's builds in each phase of ``builds``, A's flood, and the machine meanwhile."""

    alone: Tally = field(default_factory=Tally)
    beside: Tally = field(default_factory=Tally)
    burned: Tally = field(default_factory=Tally)
    """B's builds beside processes that only burn the CPU the flood took (``burning``)."""
    a: Tally = field(default_factory=Tally)
    load: Load | None = None
    busy_alone: float = 0.0
    busy_burned: float = 0.0
    burned_cores: float = 0.0


async def b_beside_a(
    args: Namespace, topics: TopicSettings, b: Org, flood: Flood, consumer: int
) -> BuildPhases:
    """B's builds alone, then beside A's flood, then beside burners that take as much of the
    machine as the flood did and send nothing: how much of B's slowdown beside the flood any
    neighbour with that appetite for CPU would cause (B's warm up first: the group, the
    caches, B's quotas read)."""
    phases = BuildPhases()
    async with build_client(args.bootstrap, topics.build_request, topics.reply_prefix) as client:
        turn = turns(b, 3)

        def call(tally: Tally) -> Callable[[int], Awaitable[None]]:
            return builder(client, turn, TYPICAL_POLICY, tally, REPLY_TIMEOUT_S)

        await paced(B_BUILDS, deadline(3), call(Tally()))
        machine = machine_busy_seconds()
        await paced(B_BUILDS, deadline(args.seconds), call(phases.alone))
        phases.busy_alone = busy_since(machine)
        phases.a, phases.load = await beside_flood(flood, call(phases.beside), consumer)
        cores = os.cpu_count() or 1
        phases.burned_cores = max(0.0, (phases.load.machine_busy - phases.busy_alone) * cores)
        with burning(phases.burned_cores):
            await asyncio.sleep(1)  # the burners started
            machine = machine_busy_seconds()
            await paced(B_BUILDS, deadline(args.seconds), call(phases.burned))
            phases.busy_burned = busy_since(machine)
    return phases


async def builds(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    a, b = Org(), Org()
    await seed(admin, [a, b])
    capacity, closed = await sustained(args, url, a)
    print(
        f"  one build consumer process sustains {capacity:,.1f} builds/s (A's typical builds, "
        f"{OUTSTANDING} always waiting, {args.capacity_seconds:g} s; {closed.answers()}; "
        f"p50 {closed.latencies('').quantile(0.5):,.0f} ms)"
    )
    rate = max(1.0, round(capacity * args.quota_share))
    burst = await set_build_quota(owner_url, a.id, rate)
    async with fresh_topics(args.bootstrap, build_topics) as (tag, topics):
        port = free_port()
        env = service_env(
            args, url, tag, topics, BUILD_PRELOAD_ENCODER="false", BUILD_METRICS_PORT=str(port)
        )
        with running(env, "build") as started:
            flood = Flood(
                args.bootstrap,
                topics.build_request,
                topics.reply_prefix,
                a,
                args.flood * capacity,
                args.seconds,
                args.flood_idle,
            )
            pid = started["build"].pid
            phases = await b_beside_a(args, topics, b, flood, pid)
            consumer = Consumer(started["build"], port)
            scraped = await asyncio.to_thread(consumer.metrics)
            rss = rss_line(started)
    a_tally, load = phases.a, phases.load
    assert load is not None
    b_alone = phases.alone.latencies(f"B's builds alone ({B_BUILDS:g}/s)")
    b_beside = phases.beside.latencies("B's builds beside A's flood")
    print("  " + b_alone.line())
    print("  " + b_beside.line())
    print(p99_ratio(b_alone, b_beside))
    b_burned = phases.burned.latencies("B's builds beside burners (no requests)")
    print(
        f"  control: burners of normal priority taking {phases.burned_cores:.2f} cores, the CPU "
        f"the flood added (the machine {phases.busy_alone:.0%} busy with B alone, "
        f"{load.machine_busy:.0%} beside the flood, {phases.busy_burned:.0%} beside the burners)"
    )
    print("  " + b_burned.line())
    print(
        f"  ratio, B's p99 beside the burners / alone: "
        f"{b_burned.quantile(0.99) / b_alone.quantile(0.99):.2f} (what that much CPU taken costs B"
        f" whoever takes it)"
    )
    print(
        f"  B's requests: alone {phases.alone.answers()}; beside {phases.beside.answers()}; "
        f"beside the burners {phases.burned.answers()}"
    )
    print(
        f"  A's flood, {flood.rate:,.0f}/s for {flood.seconds:g} s"
        f"{' (its sender under SCHED_IDLE)' if flood.idle else ''}, quota build_rate {rate:g}/s "
        f"(burst {burst}): {a_tally.answers()}"
    )
    print(
        f"  A admitted: {len(a_tally.ok) / a_tally.answered_s():,.1f}/s over the "
        f"{a_tally.answered_s():,.1f} s from its first request to its last reply"
    )
    names = {str(a.id): "A", str(b.id): "B"}
    counted = [f"{names.get(o, o)} {float(n):,.0f}" for o, n in THROTTLED.findall(scraped)]
    print(f"  contextcore_build_throttled_total: {', '.join(counted) or 'no series'}")
    print(load.line())
    print(rss)


# ------------------------------------------------------------------------------ interactive

B_INTERACTIVE = 20.0
"""B's build requests a second in ``interactive``."""
B_DOCUMENTS = 20
"""B's own documents, which its builds with the knowledge source search."""
KNOWLEDGE_POLICY = ContextPolicy(
    total_token_budget=1_700,
    sources=[*TYPICAL_POLICY.sources, *(s for s in FULL_POLICY.sources if s.name == "knowledge")],
)
"""The demo's turn and the organization's documents (bench/seeded.py's FULL_POLICY without
memory)."""


def questioned(org: Org, questions: list[str]) -> Callable[[int], ContextRequest]:
    """The demo's turn of ``org`` asking a question never asked before (a held-out question,
    numbered), so that every build encodes its query."""
    turn, asked = turns(org, 4), iter(range(10**9))

    def ask(i: int) -> ContextRequest:
        n = next(asked)
        return turn(i).model_copy(update={"query": f"{questions[n % len(questions)]} ({n})"})

    return ask


@dataclass(frozen=True)
class IngestJob:
    """A's documents, for the process that uploads them (``ingest_main``)."""

    bootstrap: str
    topics: TopicSettings
    organization: uuid.UUID
    texts: list[str]


def ingest_main(job: IngestJob, channel: Connection) -> None:
    """A's client, in a process of its own (as another machine's would be: its event loop is
    not B's): uploads every document at once, sends ``started`` as it does and ``first`` when
    one is ready, then when each became ready and the seconds until the last was."""
    channel.send(asyncio.run(ingest_all(job, channel)))


async def ingest_all(
    job: IngestJob, channel: Connection
) -> tuple[list[tuple[float, float]], float]:
    ready: list[tuple[float, float]] = []

    async def one(n: int, text: str) -> None:
        ms = await upload_text(client, job.organization, text, n)
        ready.append((time.perf_counter(), ms))  # the clock of every process (CLOCK_MONOTONIC)
        if len(ready) == 1:
            channel.send("first")

    async with knowledge_client(job.bootstrap, job.topics) as client:
        started = time.perf_counter()
        channel.send("started")
        await asyncio.gather(*(one(n, text) for n, text in enumerate(job.texts)))
        return ready, time.perf_counter() - started


@dataclass
class Ingest:
    """A's documents, and (once its process has sent them) when each became ``ready``."""

    texts: list[str]
    ready: list[tuple[float, float]] = field(default_factory=list)
    """(perf_counter when ready, milliseconds from its upload), each document."""

    def rate(self, start: float, end: float) -> str:
        """Documents a second that became ready between ``start`` and ``end``."""
        line = f"{len(between(self.ready, start, end)) / (end - start):,.1f} documents/s"
        if len(self.ready) == len(self.texts) and self.ready[-1][0] < end:
            line += " (the ingest ended before the phase: raise --ingest-documents)"
        return line


@dataclass
class Usage:
    """Where one phase's time went: each process's CPU seconds and the seconds its threads
    waited, runnable, for a core (run-queue wait); and how late this bench's own event loop
    woke from a 10 ms sleep (B's client shares it with A's uploads: a late loop would count
    in B's latencies without being the service's)."""

    seconds: float = 0.0
    used: dict[str, tuple[float, float]] = field(default_factory=dict)
    late_ms: list[float] = field(default_factory=list)
    timed: dict[str, Timed] = field(default_factory=dict)
    """The build consumer's own histograms over the phase: each record, each source read."""

    def timings(self) -> str:
        return "; ".join(f"{name} {timed.line()}" for name, timed in self.timed.items())

    def line(self, builds: int) -> str:
        parts = [f"{name} {cpu:,.1f} / {wait:,.2f}" for name, (cpu, wait) in self.used.items()]
        late = Latencies("", self.late_ms)
        build_wait = self.used.get("build", (0.0, 0.0))[1]
        return (
            f"CPU s / run-queue wait s over {self.seconds:,.1f} s: {', '.join(parts)}; "
            f"the build consumer waited {build_wait * 1000 / max(1, builds):,.1f} ms for a core "
            f"per build; this bench's loop late p99 {late.quantile(0.99):,.1f} ms, "
            f"max {max(self.late_ms, default=0):,.1f} ms"
        )


@dataclass(frozen=True)
class Timed:
    """One histogram of the build consumer's /metrics, or its change over a phase: how many,
    their seconds in all, and how many took over 50 and over 100 ms (its bucket bounds)."""

    count: float = 0.0
    total_s: float = 0.0
    over_50: float = 0.0
    over_100: float = 0.0

    def __sub__(self, other: Timed) -> Timed:
        return Timed(
            self.count - other.count,
            self.total_s - other.total_s,
            self.over_50 - other.over_50,
            self.over_100 - other.over_100,
        )

    def line(self) -> str:
        mean = self.total_s * 1000 / max(1.0, self.count)
        return (
            f"{self.count:,.0f}, mean {mean:,.1f} ms, over 50 ms {self.over_50:,.0f}, "
            f"over 100 ms {self.over_100:,.0f}"
        )


TIMED = {
    ("contextcore_consumer_record_seconds", "consumer"): "records",
    ("contextcore_source_read_seconds", "source"): "reads",
}
"""The build consumer's histograms ``Usage`` reports, by (metric, label): what they time."""


def timed(metrics: str) -> dict[str, Timed]:
    """``TIMED``'s histograms in a scrape, by what they time and the label's value."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            for (metric, label), what in TIMED.items():
                if sample.name.startswith(metric) and label in sample.labels:
                    figures = found.setdefault(f"{what} {sample.labels[label]}", {})
                    suffix, le = sample.name[len(metric) :], sample.labels.get("le")
                    if suffix in ("_count", "_sum"):
                        figures[suffix] = sample.value
                    elif suffix == "_bucket" and le in ("0.05", "0.1"):
                        figures[le] = sample.value
    return {
        name: Timed(
            f.get("_count", 0.0),
            f.get("_sum", 0.0),
            f.get("_count", 0.0) - f.get("0.05", 0.0),
            f.get("_count", 0.0) - f.get("0.1", 0.0),
        )
        for name, f in found.items()
    }


@dataclass
class Processes:
    """The processes of a run, by name, for ``Usage``; and the build consumer's /metrics."""

    pids: dict[str, list[int]]
    metrics: Callable[[], str]

    def sample(self) -> dict[str, tuple[float, float]]:
        """Each process with its descendants, but this bench's without them (its consumers)."""
        own = os.getpid()
        return {
            name: (
                sum(tree_cpu_seconds(pid, descendants=pid != own) for pid in pids),
                sum(runqueue_wait_seconds(pid, descendants=pid != own) for pid in pids),
            )
            for name, pids in self.pids.items()
        }

    @contextlib.asynccontextmanager
    async def measured(self, usage: Usage) -> AsyncIterator[None]:
        """``usage`` of what runs inside."""

        async def ticks() -> None:
            while True:
                before = time.perf_counter()
                await asyncio.sleep(0.01)
                usage.late_ms.append((time.perf_counter() - before - 0.01) * 1000)

        before, started = self.sample(), time.perf_counter()
        timed_before = timed(await asyncio.to_thread(self.metrics))
        ticker = asyncio.create_task(ticks())
        try:
            yield
        finally:
            ticker.cancel()
            after = self.sample()
            usage.seconds = time.perf_counter() - started
            usage.used = {n: (after[n][0] - c, after[n][1] - w) for n, (c, w) in before.items()}
            timed_after = timed(await asyncio.to_thread(self.metrics))
            usage.timed = {n: t - timed_before.get(n, Timed()) for n, t in timed_after.items()}


@dataclass
class Phases:
    """B's builds of one policy: alone, beside A's ingest, and when those beside began and
    ended; where the time of each went."""

    alone: Tally = field(default_factory=Tally)
    beside: Tally = field(default_factory=Tally)
    window: tuple[float, float] = (0.0, 0.0)
    alone_usage: Usage = field(default_factory=Usage)
    beside_usage: Usage = field(default_factory=Usage)


async def interactive_phases(
    args: Namespace,
    builds: ContextClient,
    job: IngestJob,
    turns_by: dict[str, Callable[[int], ContextRequest]],
    processes: Processes,
) -> tuple[dict[str, Phases], Ingest, float]:
    """B's builds of each policy alone, then A's ingest (from a process of its own) and, once
    its first document is ready, B's builds of each policy beside it; and the ingest and its
    seconds."""
    policies = {"typical": TYPICAL_POLICY, "with knowledge": KNOWLEDGE_POLICY}
    phases = {name: Phases() for name in policies}

    def call(name: str, tally: Tally) -> Callable[[int], Awaitable[None]]:
        return builder(builds, turns_by[name], policies[name], tally, REPLY_TIMEOUT_S)

    for name in policies:  # warm-up: the group, the caches, the query encoder
        await paced(B_INTERACTIVE, deadline(3), call(name, Tally()))
    for name, phase in phases.items():
        async with processes.measured(phase.alone_usage):
            await paced(B_INTERACTIVE, deadline(args.seconds), call(name, phase.alone))
    ingest = Ingest(job.texts)
    with spawned(ingest_main, job) as (channel, pid):
        processes.pids["A's client"] = [pid]
        if [await asyncio.to_thread(channel.recv) for _ in "12"] != ["started", "first"]:
            raise RuntimeError("A's ingest did not start")
        for name, phase in phases.items():
            start = time.perf_counter()
            async with processes.measured(phase.beside_usage):
                await paced(B_INTERACTIVE, deadline(args.seconds), call(name, phase.beside))
            phase.window = (start, time.perf_counter())
        ingest.ready, seconds = await asyncio.to_thread(channel.recv)
    return phases, ingest, seconds


async def interactive(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    from bench.corpora import held_out

    a, b = uuid.uuid4(), Org()
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", a)
    await seed(admin, [b])
    # A's documents: the held-out passages (a smoke's: of a few pages)
    corpus = await asyncio.to_thread(held_out, 2 if args.smoke else None)
    texts = [d.text for d in corpus.documents][: B_DOCUMENTS + args.ingest_documents]
    turns_by = {
        "typical": turns(b, 4),
        "with knowledge": questioned(b, [q.text for q in corpus.questions]),
    }
    async with fresh_topics(args.bootstrap, build_topics, upload_topics) as (tag, topics):
        port = free_port()
        env = service_env(args, url, tag, topics, BUILD_METRICS_PORT=str(port))
        with running(env, "build", "upload", "embed") as started:
            print(
                "  priority: "
                + ", ".join(f"{n} consumer {priority(p.pid)}" for n, p in started.items())
            )
            async with knowledge_client(args.bootstrap, topics) as b_docs:
                for n, text in enumerate(texts[:B_DOCUMENTS]):
                    await upload_text(b_docs, b.id, text, n)
            job = IngestJob(args.bootstrap, topics, a, texts[B_DOCUMENTS:])
            async with build_client(
                args.bootstrap, topics.build_request, topics.reply_prefix
            ) as builds:
                others = {"broker": broker_pids(), "postgres": postgres_pids()}
                processes = Processes(
                    {name: [p.pid] for name, p in started.items()}
                    | others
                    | {"bench": [os.getpid()]},
                    Consumer(started["build"], port).metrics,
                )
                phases, ingest, seconds = await interactive_phases(
                    args, builds, job, turns_by, processes
                )
            rss = rss_line(started)
    for name, phase in phases.items():
        alone = phase.alone.latencies(f"B's builds alone, {name} ({B_INTERACTIVE:g}/s)")
        beside = phase.beside.latencies(f"B's builds beside A's ingest, {name}")
        print("  " + alone.line())
        print("    " + phase.alone_usage.line(len(phase.alone.ok)))
        print("    in the build consumer: " + phase.alone_usage.timings())
        print("  " + beside.line())
        print("    " + phase.beside_usage.line(len(phase.beside.ok)))
        print("    in the build consumer: " + phase.beside_usage.timings())
        print(p99_ratio(alone, beside))
        print(f"  B's requests: alone {phase.alone.answers()}; beside {phase.beside.answers()}")
        if name == "with knowledge":
            print(
                f"  briefs with knowledge items: alone {phase.alone.had['knowledge']:,}, "
                f"beside {phase.beside.had['knowledge']:,}"
            )
        print(f"  A's ingest during B's builds {name}: {ingest.rate(*phase.window)}")
    print(
        f"  A's ingest: {len(ingest.texts):,} documents in {seconds:,.1f} s "
        f"({len(ingest.texts) / seconds:,.1f}/s overall)"
    )
    print(rss)


# ------------------------------------------------------------------------------------- huge

HUGE_DELAY_S = 10.0
"""Seconds from A's upload of its huge document to B's first upload beside it."""


def write_sections(path: Path, sections: int) -> None:
    """A Markdown document of ``sections`` short sections: ``# Section i``, one short line."""
    path.write_text("".join(f"# Section {i}\n\nshort text {i}\n\n" for i in range(sections)))


@dataclass(frozen=True)
class Outcome:
    """What became of an upload: its final status, the reason, the seconds to them."""

    status: str
    reason: str | None
    seconds: float


async def upload_document(
    client: KnowledgeClient, organization: uuid.UUID, path: Path, stage: FileStage
) -> Outcome:
    """The file at ``path`` uploaded by reference through ``stage``; its final status."""
    started = time.perf_counter()
    try:
        status: UploadStatusV1 = await client.upload_file(
            path, organization_id=organization, stage=stage, timeout=3_600
        )
    except UploadFailed as failed:
        status = failed.status
    return Outcome(status.status, status.reason, time.perf_counter() - started)


async def b_beside_huge(
    args: Namespace, topics: TopicSettings, a: uuid.UUID, b: uuid.UUID, document: Path
) -> tuple[Latencies, Latencies, Outcome]:
    """B's one-chunk uploads alone, then beside A's huge document, from ``HUGE_DELAY_S`` after
    it was uploaded; and what became of A's."""
    numbers = iter(range(10**9))
    async with (
        knowledge_client(args.bootstrap, topics) as a_client,
        knowledge_client(args.bootstrap, topics) as b_client,
    ):

        async def b_upload() -> float:
            n = next(numbers)
            text = f"B's note {n}: the quarterly review moves to Thursday, bring the figures."
            return await upload_text(b_client, b, text, n)

        for _ in range(3):  # warm-up: the encoder loads, the groups settle
            await b_upload()
        alone = [await b_upload() for _ in range(6)]
        stage = FileStage(document.parent)
        huge_upload = asyncio.create_task(upload_document(a_client, a, document, stage))
        await asyncio.sleep(args.delay)
        beside = [await b_upload() for _ in range(3)]
        outcome = await huge_upload
    return (
        Latencies("B's upload to ready alone", alone),
        Latencies("B's upload to ready beside A's huge document", beside),
        outcome,
    )


async def huge(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(a, "A"), (b, "B")]
    )
    with tempfile.TemporaryDirectory() as root:  # the upload consumer's file root
        document = Path(root) / "huge.md"
        await asyncio.to_thread(write_sections, document, args.sections)
        megabytes = document.stat().st_size / 1e6
        async with fresh_topics(args.bootstrap, upload_topics) as (tag, topics):
            # the pipeline alone, as in ``ingestion``: normal priority
            env = service_env(
                args,
                url,
                tag,
                topics,
                UPLOAD_FILE_ROOT=root,
                UPLOAD_NICE="0",
                EMBED_NICE="0",
                UPLOAD_CPU_POLICY="normal",
                EMBED_CPU_POLICY="normal",
            )
            with running(env, "upload", "embed") as started:
                alone, beside, outcome = await b_beside_huge(args, topics, a, b, document)
                rss = rss_line(started)
    stored = await admin.fetchval(
        "SELECT count(*) FROM knowledge_chunks WHERE organization_id = $1", a
    )
    source = await admin.fetchrow(
        "SELECT status, status_reason FROM knowledge_sources WHERE organization_id = $1", a
    )
    longest = longest_encode_ms([f"Section {i}\nshort text {i}" for i in range(ENCODE_MERGES)])
    print(
        f"  A's document, {args.sections:,} sections, {megabytes:,.1f} MB: {outcome.status} "
        f"{outcome.seconds:,.1f} s after its upload (B's uploads began at {args.delay:g} s): "
        f"{outcome.reason}"
    )
    kept = "no source row" if source is None else f"{source['status']}: {source['status_reason']}"
    print(f"  its source as stored: {kept}; A's chunks stored: {stored:,} (0 expected)")
    print("  " + alone.line())
    print("  " + beside.line())
    print(against_bound(alone, beside, longest))
    print(rss)


Namespace = argparse.Namespace
SCENARIOS = {
    "erasure": erasure,
    "ingestion": ingestion,
    "builds": builds,
    "interactive": interactive,
    "huge": huge,
}
SMOKE = {
    "seconds": 1.5,
    "revisions": 100,
    "documents": 20,
    "capacity_seconds": 1.0,
    "ingest_documents": 20,
    "sections": 12_000,
    "delay": 2.0,
}
"""``--smoke`` (``--quick``): the sizes of a smoke run, every scenario in seconds; its figures
mean little (12,000 sections still pass the chunk limit)."""


def arguments() -> Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", choices=list(SCENARIOS), action="append")
    parser.add_argument(
        "--smoke", "--quick", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=HUGE_DELAY_S,
        help="ingestion and huge: seconds from A's upload to B's first upload beside it",
    )
    parser.add_argument("--revisions", type=int, default=10_000, help="A's erased revisions")
    parser.add_argument("--rate", type=float, default=50, help="B's memory writes per second")
    parser.add_argument("--seconds", type=float, default=8, help="each of B's phases")
    parser.add_argument("--documents", type=int, default=5_000, help="A's flood of uploads")
    parser.add_argument(
        "--capacity-seconds", type=float, default=5, help="builds: one process's capacity, measured"
    )
    parser.add_argument(
        "--ingest-documents", type=int, default=2_000, help="interactive: A's ingest"
    )
    parser.add_argument("--sections", type=int, default=100_000, help="huge: A's document")
    parser.add_argument(
        "--quota-share",
        type=float,
        default=QUOTA_SHARE,
        help=f"builds: A's quota build_rate, a share of the capacity measured ({QUOTA_SHARE:g})",
    )
    parser.add_argument(
        "--flood",
        type=float,
        default=FLOOD,
        help=f"builds: A's rate, in times the capacity measured ({FLOOD:g}; at --quota-share or "
        "below, A sends no excess: what A's admitted builds alone cost B)",
    )
    parser.add_argument(
        "--flood-idle",
        action="store_true",
        help="builds: A's flood sender under SCHED_IDLE, as if on a machine of its own (a "
        "diagnostic of what the sender takes from two cores; the target's figure is without it)",
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    return args


async def main() -> None:
    args = arguments()
    name = database_name("bench_fairness", args.smoke)
    seeded = await prepare(name, 0)
    args.bootstrap = seeded.stack.bootstrap_servers
    admin = await asyncpg.connect(seeded.admin_url)
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores")
    try:
        for scenario in args.only or list(SCENARIOS):
            print(f"[{scenario}]")
            await SCENARIOS[scenario](seeded.url, seeded.owner_url, admin, args)
    finally:
        await admin.close()
        await drop(seeded.stack, name)


if __name__ == "__main__":
    asyncio.run(main())
