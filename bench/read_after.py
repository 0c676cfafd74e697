"""Read-your-writes across a replica (issue 34): what a position costs, in one run.

    python -m bench.read_after [--builds 300] [--smoke]

On the dev stack with its hot standby (started here, as ``contextcore dev up --replica``): a
memory consumer on the primary, and a build consumer whose sources read the standby
(``CONTEXTCORE_DATABASE_READ_URL``). One user's turns, one at a time, each a build of the
typical sources and the user's memories:

1. **The position's statement**: p50/p99 of ``write_position`` on the primary, the statement
   every memory answer and ``ready`` status now costs.
2. **Builds without a position** (the standby, as before read-your-writes).
3. **A remember, then a build** at once (a turn that learns a fact and builds on it), the
   turns taking turns: a build without the position (the control: the standby's state, as it
   is), and one naming it: each one's p50/p99, and how many of the latter the standby served
   (it had replayed the write by the time the build asked) or the primary. The user's memories
   grow through the phases (a new text each turn, 50 chains), and a memory read costs more
   with more revisions: the two kinds alternate, so each sees the same history.
4. **Builds naming a position the standby has not replayed** (its replay paused): the primary
   serves each.

Prints figures, never passes or fails; the CPU flags and the processes' peak RSS beside them.
``--smoke``: every phase with a few builds (tests/integration/test_bench_smoke.py), on a database
of its own; the standby started as above when it does not run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import urllib.request
import uuid

import asyncpg

from bench.e2e import free_port
from bench.fairness import Latencies, cpu_flags, fresh_topics, service_env
from bench.processes import peak_rss_mb, start_consumer
from bench.seeded import TYPICAL_POLICY, Org, database_name, drop, prepare, seed
from broker.settings import TopicSettings
from broker.topics import all_topics, build_topics, memory_topics
from contextcore.storage.pool import create_pool
from contextcore.storage.positions import write_position
from devstack.replica import on_standby
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS, DevStack
from producers.client import ChannelOptions, ContextClient, Session
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate

POLICY = ContextPolicy(
    total_token_budget=1_600,
    sources=[*TYPICAL_POLICY.sources, ContextSourceSpec(name="memory", token_budget=400)],
)
SERVED = re.compile(r'^contextcore_build_read_after_total\{database="(\w+)"\} (\S+)$', re.M)


def served(port: int) -> dict[str, float]:
    """The build consumer's ``contextcore_build_read_after_total`` by database."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        body = page.read().decode()
    return {database: float(count) for database, count in SERVED.findall(body)}


async def replayed_database(url: str) -> asyncpg.Connection:
    """A connection to the bench's database on the standby, once the standby has it."""
    for _ in range(300):
        try:
            return await asyncpg.connect(url)
        except asyncpg.InvalidCatalogNameError:
            await asyncio.sleep(0.1)
    raise RuntimeError("the standby did not replay the bench's database in 30 s")


async def statement(url: str, count: int) -> str:
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        times = []
        for _ in range(count + 20):
            started = time.perf_counter()
            await write_position(pool)
            times.append((time.perf_counter() - started) * 1000)
        measured = Latencies("", times[20:])
        return (
            f"the position's statement (a memory answer's, a ready status's): {count} calls, "
            f"p50 {measured.quantile(0.5):.3f} ms, p99 {measured.quantile(0.99):.3f} ms"
        )
    finally:
        await pool.close()


SMOKE = {"builds": 3, "statements": 50}
"""``--smoke``: the sizes of a smoke run (each kind's 10 warm-up builds come on top)."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.read_after", description=__doc__)
    parser.add_argument("--builds", type=int, default=300, help="builds of each kind")
    parser.add_argument("--statements", type=int, default=1_000, help="the position's, timed")
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    stack = DevStack()
    await stack.up(all_topics(TopicSettings()), replica=True)
    name = database_name("bench_read_after", args.smoke)
    seeded = await prepare(name, 0)
    args.bootstrap = seeded.stack.bootstrap_servers
    admin = await asyncpg.connect(seeded.admin_url)
    standby = await replayed_database(on_standby(seeded.admin_url, stack.settings.replica_port))
    org = Org()
    print(f"CPU flags: {cpu_flags()}; replica on port {stack.settings.replica_port}")
    try:
        await seed(admin, [org])
        print(f"  {await statement(seeded.url, args.statements)}")
        async with fresh_topics(args.bootstrap, build_topics, memory_topics) as (tag, topics):
            port = free_port()
            env = service_env(
                args,
                seeded.url,
                tag,
                topics,
                DATABASE_READ_URL=on_standby(seeded.url, stack.settings.replica_port),
                BUILD_PRELOAD_ENCODER="false",
                BUILD_METRICS_PORT=str(port),
            )
            build = start_consumer("build", env)
            memory = start_consumer("memory", env)
            try:
                await turns(args, topics, org, port, admin, standby)
                rss = (
                    f"build {peak_rss_mb(build.pid):,.0f} MB, memory {peak_rss_mb(memory.pid):,.0f}"
                )
                print(f"  peak RSS: {rss} MB")
            finally:
                for process in (build, memory):
                    process.terminate()
                    process.wait(60)
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()
        await admin.close()
        await drop(seeded.stack, name)


async def turns(
    args: argparse.Namespace,
    topics: TopicSettings,
    org: Org,
    port: int,
    admin: asyncpg.Connection,
    standby: asyncpg.Connection,
) -> None:
    options = ChannelOptions(
        bootstrap_servers=args.bootstrap,
        reply_topic_prefix=topics.reply_prefix,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    )
    session = Session()
    shared = ChannelOptions(**options, session=session)  # the caller's two clients
    principal = Invoker(organization_id=org.id, definition_id=uuid.uuid4(), user_id=uuid.uuid4())
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=org.id,
            user_id=principal.user_id,
            trigger_id=None,
            definition_id=principal.definition_id,
        ),
        query="what does this user prefer?",
        entities=(),
    )
    async with (
        MemoryClient(memory_topic=topics.memory_write, **shared) as memories,
        ContextClient(request_topic=topics.build_request, **shared) as ours,
        ContextClient(request_topic=topics.build_request, **options) as anyone,
    ):
        writes = iter(range(1_000_000))

        async def remember(_: int) -> None:
            i = next(writes)  # a new text each time: a write, never a duplicate
            memory = MemoryCandidate(scope="user", attribute=f"preference.p{i % 50}", text=f"P {i}")
            answer = await memories.remember(principal, memory)
            assert answer.status == "written", answer

        async def timed(clients: dict[str, ContextClient], before: bool) -> list[Latencies]:
            """``args.builds`` builds through each of ``clients``, taking turns (so that both
            see a user of as many revisions), each after a remember when ``before``."""
            times: dict[str, list[float]] = {label: [] for label in clients}
            for i in range(args.builds + 10):
                for label, client in clients.items():
                    if before:
                        await remember(i)
                    started = time.perf_counter()
                    brief = await client.build(request, POLICY, timeout=30)
                    times[label].append((time.perf_counter() - started) * 1000)
                    assert not brief.failed_sources, brief.failed_sources
            return [Latencies(label, values[10:]) for label, values in times.items()]

        async def revisions() -> str:
            count = await admin.fetchval(
                "SELECT count(*) FROM memories WHERE user_id = $1", principal.user_id
            )
            return f"(the user has {count:,} revisions now)"

        await remember(0)
        [plain] = await timed({"builds without a position (the standby)": anyone}, before=False)
        print(f"  {plain.line()}")
        counted = served(port)
        control, turn = await timed(
            {
                "a remember, then a build without its position": anyone,
                "a remember, then a build naming its position": ours,
            },
            before=True,
        )
        after = served(port)
        by = {db: after.get(db, 0) - counted.get(db, 0) for db in ("replica", "primary")}
        print(f"  {control.line()}")
        print(
            f"  {turn.line()}; served by the standby {by['replica']:,.0f}, "
            f"by the primary {by['primary']:,.0f} {await revisions()}"
        )
        await standby.execute("SELECT pg_wal_replay_pause()")
        await remember(10_000)  # past what the standby has replayed
        [ahead] = await timed({"a position the standby has not replayed": ours}, before=False)
        print(f"  {ahead.line()}")
        await standby.execute("SELECT pg_wal_replay_resume()")


if __name__ == "__main__":
    asyncio.run(main())
