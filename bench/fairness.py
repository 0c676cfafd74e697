"""Fair shares under noisy neighbours (issue 33): each scenario runs a victim organization B
alone, then beside organization A's flood, in one run, and prints both and their ratio.

    python -m bench.fairness [--only erasure|ingestion] [--revisions 10000] [--rate 50]
                             [--documents 5000]

Scenarios measured so far:

* ``erasure``: A's operator erases one user's ``--revisions`` memories (each written through the
  memory service, so each has its journal row) while B's agents write memories at ``--rate``
  calls/s through a running memory consumer (its own process, the real broker) and read B's
  memories through the memory source; A's agents keep writing too (10/s), so A's writes share
  batches with B's. Target: B's write p99 beside the erasure at most 2x B's p99 alone; B's reads
  likewise. Prints how long the erasure held A's lock, and the memory consumer's peak RSS.

* ``ingestion``: A uploads ``--documents`` one-passage documents at once through its
  ``KnowledgeClient`` (B has its own) to a running upload consumer and embedding consumer
  (their own processes); 10 s later B uploads one document, three times in a row. B's
  upload-to-``ready`` alone and beside A's flood; A's documents per second alone and beside B.
  Target: B beside at most twice B alone plus the longest single encode of the flood (printed:
  an encode of as many of the flood's passages as one encode merges, on this machine, with the
  consumers stopped); A's rate beside at least 0.9 of A's alone.

Prints figures; never passes or fails. CPU flags beside the figures (they differ between
machines; compare the ratios of one run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import asyncpg

from bench.processes import peak_rss_mb, start_consumer
from bench.seeded import drop, prepare
from broker.settings import TopicSettings
from broker.topics import ensure_topics, memory_topics
from contextcore.memory.erasure import erase
from contextcore.memory.service import MemoryService
from contextcore.memory.store import PostgresMemoryJournal
from contextcore.sources.memory import MemoryContextSource
from contextcore.storage.pool import create_pool
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from producers.memory import MemoryClient
from schemas.context import ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate


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
            f"p99 {self.quantile(0.99):,.1f} ms, max {max(self.values, default=0):,.1f} ms"
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


async def erasure(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    a, b, definition = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    a_user, b_user = uuid.uuid4(), uuid.uuid4()
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(a, "A"), (b, "B")]
    )
    pool = await create_pool(url, min_size=2, max_size=4, session_role=SERVICE_ROLE)
    started = time.perf_counter()
    await seed_revisions(
        pool, Invoker(organization_id=a, definition_id=definition, user_id=a_user), args.revisions
    )
    await admin.execute("ANALYZE memories, memory_writes")
    print(
        f"  seeded {args.revisions:,} revisions of A's user, each with its journal row, in "
        f"{time.perf_counter() - started:.0f} s"
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
            organization_id=b, user_id=b_user, trigger_id=None, definition_id=definition
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


async def ingestion(url: str, owner_url: str, admin: asyncpg.Connection, args: Namespace) -> None:
    from bench.corpora import CACHE
    from bench.ingest import passages
    from broker.topics import TopicSpec, upload_topics
    from contextcore.knowledge.encoder import DEFAULT_MODEL, SentenceTransformerEncoder
    from contextcore.knowledge.settings import KnowledgeSettings
    from producers.knowledge import KnowledgeClient

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
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_UPLOAD_GROUP_ID": f"bench-{tag}-upload",
        "CONTEXTCORE_UPLOAD_METRICS_PORT": "0",
        "CONTEXTCORE_EMBED_GROUP_ID": f"bench-{tag}-embed",
        "CONTEXTCORE_EMBED_METRICS_PORT": "0",
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
        # the lanes alone: the consumers' lower CPU priority is for builds beside them
        "CONTEXTCORE_UPLOAD_NICE": "0",
        "CONTEXTCORE_EMBED_NICE": "0",
    }
    # the held-out passages (4,500); the flood reuses them past that, each upload a document
    texts = [text.decode() for _, text in passages(args.documents + 20)]
    flood = [texts[i % (len(texts) - 20)] for i in range(args.documents)]
    own = texts[-20:]
    upload = start_consumer("upload", env)
    embed = start_consumer("embed", env)
    # each organization its own service and client, as tenants are: B's requests and replies
    # never queue behind A's in one producer or one reply topic
    clients = {
        organization: KnowledgeClient(
            bootstrap_servers=args.bootstrap,
            upload_topic=topics.upload,
            reply_topic_prefix=topics.reply_prefix,
            fetch_max_wait_ms=20,
            max_in_flight=1_000,
        )
        for organization in (a, b)
    }
    for client in clients.values():
        await client.start()
        await ensure_topics(args.bootstrap, [TopicSpec(client.reply_topic, 1)])
    uploaded = iter(range(10**9))

    async def upload_one(organization: uuid.UUID, text: str) -> float:
        n = next(uploaded)
        started = time.perf_counter()
        status = await clients[organization].upload(
            organization_id=organization,
            title=f"doc {n}",
            media_type="text/plain",
            uri=f"bench://{n}",
            content=text,
            timeout=3_600,
        )
        assert status.status == "ready", status
        return (time.perf_counter() - started) * 1000

    async def a_floods(label: str) -> tuple[float, list[float]]:
        """A's documents per second, and B's three uploads' milliseconds (none: A alone)."""
        started = time.perf_counter()
        flooding = asyncio.gather(*(upload_one(a, text) for text in flood))
        b_times: list[float] = []
        if label == "beside":
            await asyncio.sleep(10)
            for text in own[3:6]:
                b_times.append(await upload_one(b, text))
        await flooding
        return args.documents / (time.perf_counter() - started), b_times

    try:
        for text in own[:3]:  # warm-up: the encoder loads, the groups settle
            await upload_one(b, text)
        b_alone = [await upload_one(b, text) for text in own[6:12]]
        a_alone, _ = await a_floods("alone")
        a_beside, b_beside = await a_floods("beside")
        rss = {"upload": peak_rss_mb(upload.pid), "embed": peak_rss_mb(embed.pid)}
    finally:
        for client in clients.values():
            await client.close()
        for process in (upload, embed):
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = SentenceTransformerEncoder(
        DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
    )
    encoder.encode(flood[:64])  # warm
    started = time.perf_counter()
    encoder.encode(flood[:64])  # as many passages as one encode merges (CoalescingEncoder)
    longest = (time.perf_counter() - started) * 1000
    alone = Latencies("B's upload to ready alone", b_alone)
    beside = Latencies("B's upload to ready beside A's flood", b_beside)
    print("  " + alone.line())
    print("  " + beside.line())
    print(f"  the longest single encode of the flood (64 passages, OpenVINO): {longest:,.0f} ms")
    bound = 2 * alone.quantile(0.5) + longest
    print(
        f"  B beside, worst: {max(b_beside):,.0f} ms against the bound 2 x alone + one encode = "
        f"{bound:,.0f} ms (ratio to B alone, median: "
        f"{beside.quantile(0.5) / alone.quantile(0.5):.1f})"
    )
    print(
        f"  A's {args.documents:,} documents: {a_alone:.1f}/s alone, {a_beside:.1f}/s beside B "
        f"({a_beside / a_alone:.2f} of alone; target >= 0.9)"
    )
    print(
        f"  peak RSS: upload consumer {rss['upload']:.0f} MB, "
        f"embedding consumer {rss['embed']:.0f} MB (targets < 300, < 1,536)"
    )


Namespace = argparse.Namespace
SCENARIOS = {"erasure": erasure, "ingestion": ingestion}


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--revisions", type=int, default=10_000, help="A's erased revisions")
    parser.add_argument("--rate", type=float, default=50, help="B's memory writes per second")
    parser.add_argument("--seconds", type=float, default=8, help="B's phase alone")
    parser.add_argument("--documents", type=int, default=5_000, help="A's flood of uploads")
    args = parser.parse_args()
    name = "bench_fairness"
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
