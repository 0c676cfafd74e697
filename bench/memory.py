"""Agent memory: writes end to end through Kafka, and the memory source at scale.

    python -m bench.memory [--writes 6000] [--window 64] [--reads 2000]
                           [--skip-writes] [--skip-reads] [--skip-erase] [--smoke]

1. ``remember`` calls per second, end to end (published, applied by a running memory consumer in
   its own process, answered on the reply topic), with 1, 4 and 16 concurrent producers (each a
   ``MemoryClient`` keeping ``--window`` calls in flight), over 100 organizations; and the
   consumer's peak RSS (VmHWM).
2. The memory source: p50/p99 of ``retrieve`` (limit 20) at 10,000 live memories per
   organization over 100 organizations (plus superseded revisions and tombstones, a fifth of
   them user memories, one in twenty naming a CRM company the source must resolve), for a run
   subject (one definition) and for a front-door turn (every definition).
3. ``memory_erase`` of one user with 200, 2,000 and 10,000 chains: how long it holds its lock,
   the VACUUM after it, and how long another tenant's write that arrives meanwhile takes.

Targets on this 2-core machine: at least 1,000 writes/s end to end; source p99 under 10 ms;
consumer RSS under 300 MB. Prints figures; never passes or fails. ``--smoke``: every phase at
tiny sizes (seconds; the figures mean little), as tests/integration/test_bench_smoke.py runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import time
import uuid

import asyncpg

from bench.processes import peak_rss_mb, start_consumer, tree_cpu_seconds
from bench.seeded import database_name, drop, prepare
from broker.settings import TopicSettings
from broker.topics import ensure_topics, memory_topics
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService
from contextcore.sources.memory import MemoryContextSource
from contextcore.storage.pool import create_pool
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from devstack.stack import DevStack
from producers.memory import MemoryClient
from schemas.context import ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate

ORGANIZATIONS = 100
PER_ORGANIZATION = 10_000
DEFINITIONS = 4
USERS = 10
CHAINS = (200, 2_000, 10_000)
WARM_UP = 2_000
SMOKE = {
    "writes": 64,
    "window": 8,
    "warm_up": 32,
    "reads": 20,
    "organizations": 4,
    "memories": 200,
    "chains": [20, 200],
}
"""``--smoke``: the sizes of a smoke run."""


async def writes(
    bootstrap: str,
    topics: TopicSettings,
    orgs: list[uuid.UUID],
    producers: int,
    total: int,
    window: int,
) -> float:
    """Remember/s of ``total`` calls spread over ``producers`` clients."""
    clients = [
        MemoryClient(
            bootstrap_servers=bootstrap,
            memory_topic=topics.memory_write,
            reply_topic_prefix=topics.reply_prefix,
            fetch_max_wait_ms=20,
        )
        for _ in range(producers)
    ]
    await asyncio.gather(*(c.start() for c in clients))
    run = uuid.uuid4().hex[:6]

    async def produce(number: int, client: MemoryClient) -> None:
        slots = asyncio.Semaphore(window)

        async def one(i: int) -> None:
            async with slots:
                org = orgs[i % len(orgs)]
                principal = Invoker(
                    organization_id=org, definition_id=org, user_id=uuid.UUID(int=i % USERS)
                )
                candidate = MemoryCandidate(
                    scope="user" if i % 5 == 0 else "organization",
                    attribute=f"observation.w{run}_{number}_{i % 500}",
                    text=f"fact {i} from producer {number}",
                )
                answer = await client.remember(principal, candidate, timeout=120)
                assert answer.status == "written", answer

        await asyncio.gather(*(one(i) for i in range(total // producers)))

    try:
        started = time.perf_counter()
        await asyncio.gather(*(produce(n, c) for n, c in enumerate(clients)))
        return (total // producers * producers) / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(c.close() for c in clients))


WAL_NOW = "SELECT pg_current_wal_lsn()::text"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)"
"""The primary's log written since a position: the whole cluster's, so a quiet one (the dev
stack's, under this bench alone) to be read as the writes'."""


async def stored_bytes(admin: asyncpg.Connection) -> str:
    """What a revision and its journal row hold on disk, tables with their indexes and TOAST."""
    rows = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM memories) AS revisions,"
        " (SELECT count(*) FROM memory_writes) AS journal,"
        " pg_total_relation_size('memories') AS memories_bytes,"
        " pg_total_relation_size('memory_writes') AS journal_bytes"
    )
    assert rows is not None
    return (
        f"stored: {rows['memories_bytes'] / max(rows['revisions'], 1):,.0f} bytes a revision "
        f"({rows['revisions']:,} in memories, indexes included), "
        f"{rows['journal_bytes'] / max(rows['journal'], 1):,.0f} bytes a journal row "
        f"({rows['journal']:,})"
    )


async def seed_memories(
    admin: asyncpg.Connection, orgs: list[uuid.UUID], per_organization: int = PER_ORGANIZATION
) -> None:
    """10,000 live chains per organization (``per_organization``), 1 in 10 with an older
    revision, 1 in 50 with a tombstone after it (not live), 1 in 5 user memories, 1 in 20 naming
    a CRM company."""
    for org in orgs:
        await admin.execute(
            "INSERT INTO crm_companies (organization_id, id, name)"
            " SELECT $1, gen_random_uuid(), 'Co ' || i FROM generate_series(1, 50) AS i",
            org,
        )
        await admin.execute(
            """
            WITH companies AS (
                SELECT array_agg(id) AS ids FROM crm_companies WHERE organization_id = $1
            ), facts AS (
                SELECT i,
                       ('00000000-0000-4000-8000-' || lpad(to_hex(i % 4), 12, '0'))::uuid
                           AS definition,
                       CASE WHEN i % 5 = 0 THEN 'user' ELSE 'organization' END AS scope,
                       CASE WHEN i % 5 = 0
                            THEN ('00000000-0000-0000-0000-' || lpad(to_hex(i % 10), 12, '0'))::uuid
                       END AS user_id,
                       CASE WHEN i % 20 = 0 THEN (SELECT ids[1 + i % 50] FROM companies) END
                           AS company
                FROM generate_series(1, $2) AS i
            )
            INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,
                                  text, subject_refs, created_at)
            SELECT $1, definition, scope, user_id,
                   CASE WHEN company IS NOT NULL THEN 'crm.company:' || company
                        WHEN scope = 'user' THEN 'user:' || user_id
                        ELSE 'organization:' || $1::uuid END || ':observation.f' || i,
                   'remembered fact number ' || i,
                   CASE WHEN company IS NOT NULL
                        THEN jsonb_build_array(
                            jsonb_build_object('kind', 'crm.company', 'id', company::text))
                        ELSE '[]'::jsonb END,
                   now() - make_interval(secs => $2 - i)
            FROM facts
            """,
            org,
            per_organization + per_organization // 50,
        )
        # a newer revision for 1 in 10 chains; a tombstone for 1 in 50 (those are not live)
        await admin.execute(
            """
            INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,
                                  text, subject_refs, supersedes_id, forgotten_at, created_at)
            SELECT organization_id, definition_id, scope, user_id, subject_key,
                   CASE WHEN n % 50 = 0 THEN NULL ELSE text || ' (revised)' END,
                   subject_refs, id,
                   CASE WHEN n % 50 = 0 THEN now() END,
                   created_at + interval '1 millisecond'
            FROM (SELECT *, row_number() OVER (ORDER BY created_at) AS n
                  FROM memories
                  -- the seeded roots only: the write phase's chains have children already
                  WHERE organization_id = $1 AND supersedes_id IS NULL
                    AND split_part(subject_key, ':', 3) LIKE 'observation.f%') AS m
            WHERE n % 10 = 0 OR n % 50 = 0
            """,
            org,
        )
    await admin.execute("ANALYZE memories")


async def reads(url: str, orgs: list[uuid.UUID], count: int) -> None:
    # the service role's sessions: the memory source reads through its function (00033)
    pool = await create_pool(url, min_size=2, max_size=2, session_role=SERVICE_ROLE)
    source = MemoryContextSource(TenantDatabase(pool))
    spec = ContextSourceSpec(name="memory", token_budget=4000)
    rng = random.Random(7)
    try:
        for label, definition in (("a run (one definition)", True), ("a front-door turn", False)):
            times: list[float] = []
            items = 0
            for n in range(count + 50):
                org = rng.choice(orgs)
                subject = ContextSubject(
                    organization_id=org,
                    user_id=uuid.UUID(int=rng.randrange(USERS)),
                    trigger_id=None,
                    definition_id=uuid.UUID(f"00000000-0000-4000-8000-{rng.randrange(4):012x}")
                    if definition
                    else None,
                )
                request = ContextRequest(subject=subject, query="", entities=())
                started = time.perf_counter()
                found = await source.retrieve(request, spec)
                if n >= 50:  # the first 50 warm the pool's statements
                    times.append((time.perf_counter() - started) * 1000)
                    items += len(found)
            times.sort()
            print(
                f"memory source, {label}: p50 {statistics.median(times):.2f} ms, "
                f"p99 {times[int(len(times) * 0.99) - 1]:.2f} ms, "
                f"{items / len(times):.1f} items per read ({len(times)} reads; target p99 < 10 ms)"
            )
    finally:
        await pool.close()


async def erasures(
    admin: asyncpg.Connection, owner_url: str, url: str, sizes: list[int] | tuple[int, ...] = CHAINS
) -> None:
    """``memory_erase`` of one user with n chains (a tenth with a second revision), timed, and
    how long a write of another tenant that arrives meanwhile waits for its lock."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    assert pool is not None
    service = MemoryService(PostgresMemoryJournal(TenantDatabase(pool)))
    person, definition = uuid.uuid4(), uuid.uuid4()
    try:
        for chains in sizes:
            org, other = uuid.uuid4(), uuid.uuid4()
            await admin.executemany(
                "INSERT INTO organizations (id, name) VALUES ($1, 'erase')", [(org,), (other,)]
            )
            await admin.execute(
                """
                INSERT INTO memories (organization_id, definition_id, scope, user_id,
                                      subject_key, text)
                SELECT $1, $2, 'user', $3, 'user:' || $4 || ':observation.f' || i,
                       'a fact about the person, number ' || i
                FROM generate_series(1, $5) AS i
                """,
                org,
                definition,
                person,
                str(person),
                chains,
            )
            await admin.execute(
                """
                INSERT INTO memories (organization_id, definition_id, scope, user_id,
                                      subject_key, text, supersedes_id)
                SELECT organization_id, definition_id, scope, user_id, subject_key,
                       text || ' (revised)', id
                FROM memories WHERE organization_id = $1 AND random() < 0.1
                """,
                org,
            )
            await admin.execute("ANALYZE memories")
            revisions = await admin.fetchval(
                "SELECT count(*) FROM memories WHERE organization_id = $1", org
            )
            owner = await asyncpg.connect(owner_url)
            try:
                started = time.perf_counter()
                transaction = owner.transaction()
                await transaction.start()
                erased = asyncio.create_task(
                    owner.fetchrow(
                        "SELECT * FROM memory_erase($1, 'user', $2, true)", org, str(person)
                    )
                )
                await asyncio.sleep(0.005)
                invoker = Invoker(organization_id=other, definition_id=definition, user_id=person)
                candidate = MemoryCandidate(scope="user", attribute="observation.x", text="x")
                write_started = time.perf_counter()
                writing = asyncio.create_task(
                    service.remember(invoker, candidate, uuid.uuid4().hex)
                )
                row = await erased
                await transaction.commit()
                held = time.perf_counter() - started
                await writing
                waited = time.perf_counter() - write_started
                started = time.perf_counter()
                await owner.execute("VACUUM memories, memory_writes")
                vacuumed = time.perf_counter() - started
            finally:
                await owner.close()
            assert row is not None
            print(
                f"erase a user: {row['revisions']:,} revisions of {row['chains']:,} chains "
                f"({revisions:,} in the organization) in {held * 1000:,.0f} ms under the lock, "
                f"then VACUUM {vacuumed * 1000:,.0f} ms; another tenant's write meanwhile took "
                f"{waited * 1000:,.0f} ms"
            )
    finally:
        await pool.close()


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--writes", type=int, default=6_000)
    parser.add_argument("--window", type=int, default=64, help="calls in flight per producer")
    parser.add_argument("--reads", type=int, default=2_000)
    parser.add_argument("--skip-writes", action="store_true")
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument("--skip-erase", action="store_true")
    parser.add_argument("--warm-up", type=int, default=WARM_UP, help="writes before the figures")
    parser.add_argument("--organizations", type=int, default=ORGANIZATIONS)
    parser.add_argument(
        "--memories", type=int, default=PER_ORGANIZATION, help="live chains per organization"
    )
    parser.add_argument("--chains", type=int, nargs="+", default=list(CHAINS), help="erased")
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, every phase: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    name = database_name("bench_memory", args.smoke)
    seeded = await prepare(name, 0)
    admin = await asyncpg.connect(seeded.admin_url)
    orgs = [uuid.uuid4() for _ in range(args.organizations)]
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, 'bench')", [(o,) for o in orgs]
    )
    bootstrap = seeded.stack.bootstrap_servers
    try:
        if not args.skip_writes:
            tag = uuid.uuid4().hex[:8]
            topics = TopicSettings.model_construct(
                memory_write=f"bench.{tag}.memory-write",
                memory_write_partitions=4,
                reply_prefix=f"bench.{tag}.reply",
            )
            await ensure_topics(bootstrap, memory_topics(topics))
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
                "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                # not the dev stack's 2 ms: Tansu starves a lagging consumer whose poll is
                # short, and a partition stalls; not 100 ms: Tansu answers a fetch only when
                # the poll ends, so the poll bounds the consumer's rate (docs/delivery.md)
                "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": "50",
                "CONTEXTCORE_DATABASE_URL": seeded.url,
                "CONTEXTCORE_TOPIC_MEMORY_WRITE": topics.memory_write,
                # the clients' reply topics are under the bench's prefix: the consumer's
                # reply-topic rule must say so, or it answers nothing (broker/reply_topics.py)
                "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
                "CONTEXTCORE_MEMORY_GROUP_ID": f"bench-{tag}-memory",
                "CONTEXTCORE_MEMORY_METRICS_PORT": "0",
            }
            consumer = start_consumer("memory", env)
            stack = DevStack()
            postgres = int((stack.pg_data / "postmaster.pid").read_text().split()[0])
            tansu = int(stack.broker_pid_file.read_text())
            try:
                # warm-up, then statistics: a fresh, empty database plans its first statements
                # for empty tables, and the first thousands of writes ran at half the rate
                # (a production table has statistics)
                await writes(bootstrap, topics, orgs, 4, args.warm_up, args.window)
                await admin.execute("ANALYZE memories, memory_writes, organizations")
                for producers in (1, 4, 16):
                    cpu = {p: tree_cpu_seconds(p) for p in (consumer.pid, postgres, tansu)}
                    own = time.process_time()
                    wal = await admin.fetchval(WAL_NOW)
                    rate = await writes(
                        bootstrap, topics, orgs, producers, args.writes, args.window
                    )
                    wal_bytes = await admin.fetchval(WAL_SINCE, wal)
                    used = {p: tree_cpu_seconds(p) - cpu[p] for p in cpu}
                    used[os.getpid()] = time.process_time() - own
                    print(
                        f"remember end to end, {producers:>2} producers x {args.window} in flight: "
                        f"{rate:,.0f} writes/s (target >= 1,000); CPU s: consumer "
                        f"{used[consumer.pid]:.1f}, PostgreSQL {used[postgres]:.1f}, Tansu "
                        f"{used[tansu]:.1f}, the producers (this process) {used[os.getpid()]:.1f}; "
                        f"WAL {wal_bytes / args.writes:,.0f} bytes a write"
                    )
                print(
                    f"memory consumer peak RSS: {peak_rss_mb(consumer.pid):.0f} MB (target < 300)"
                )
                print(await stored_bytes(admin))
            finally:
                consumer.send_signal(signal.SIGTERM)
                consumer.wait(60)
        if not args.skip_reads:
            started = time.perf_counter()
            await seed_memories(admin, orgs, args.memories)
            rows = await admin.fetchval("SELECT count(*) FROM memories")
            live = await admin.fetchval("SELECT count(*) FROM live_memories")
            print(
                f"seeded {rows:,} revisions, {live:,} live, over {len(orgs)} organizations "
                f"in {time.perf_counter() - started:.0f} s"
            )
            await reads(seeded.url, orgs, args.reads)
        if not args.skip_erase:
            await erasures(admin, seeded.owner_url, seeded.url, args.chains)
    finally:
        await admin.close()
        await drop(seeded.stack, name)


if __name__ == "__main__":
    asyncio.run(main())
