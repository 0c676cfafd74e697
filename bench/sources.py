"""Source and whole-build latency on a seeded database, in process (no Kafka).

Seeds a fresh database (``bench_sources``) with 100 organizations, each with 10,000 CRM rows
(4,000 companies, 4,000 people, 2,000 deals), 1,000 runs and 50 conversations of 20 messages,
through COPY. Then, for random organizations, it reads each of the five sources and whole
``build`` calls (all five, concurrently, through the tenancy layer and RLS) and prints p50/p99,
the queries each source sent, and the process's peak RSS. Prints figures; never passes or fails.

    .venv/bin/python -m bench.sources [--organizations 100] [--builds 500] [--smoke]

Target (issue 4): p99 of a whole build under 15 ms on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import statistics
import time
from typing import Any

import asyncpg

from bench.seeded import POLICY, database_name, drop, prepare, request_for
from consumers.build.sources import SourceCaches, process_registry
from contextcore.builder import DefaultContextBuilder
from contextcore.packer import ContextPacker
from contextcore.storage.invalidation import CacheInvalidator
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase

DATABASE = "bench_sources"
SMOKE = {"organizations": 2, "builds": 20, "rounds": 20}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py)."""


def figures(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{label:<20} p50 {statistics.median(ms):6.2f} ms   p99 {p99:6.2f} ms   n={len(ms)}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--organizations", type=int, default=100)
    parser.add_argument("--builds", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=200, help="reads of each source")
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    database = database_name(DATABASE, args.smoke)

    seeded = await prepare(database, args.organizations)
    orgs, url = seeded.orgs, seeded.url

    queries: dict[str, int] = {}

    def count(record: Any) -> None:
        head = record.query.lstrip().split(":", 1)[0]
        if head.startswith("-- "):
            queries[head[3:]] = queries.get(head[3:], 0) + 1

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(count)
        await conn.execute("SELECT set_config('role', $1, false)", SERVICE_ROLE)

    pool = await asyncpg.create_pool(url, min_size=5, max_size=10, init=init)
    assert pool is not None
    caches = SourceCaches()
    invalidator = CacheInvalidator(caches.by_channel(), url)
    await invalidator.start()
    registry = process_registry(TenantDatabase(pool), caches)
    builder = DefaultContextBuilder(registry, ContextPacker())
    rng = random.Random(7)
    try:
        for _ in range(50):  # warm-up: connections, plans, the dossier cache of a few orgs
            await builder.build(request_for(rng.choice(orgs), rng), POLICY)
        per_source: dict[str, list[float]] = {spec.name: [] for spec in POLICY.sources}
        queries.clear()
        rounds = args.rounds
        for _ in range(rounds):
            request = request_for(rng.choice(orgs), rng)
            for spec in POLICY.sources:
                source = registry.get(spec.name)
                assert source is not None
                started = time.perf_counter()
                await source.retrieve(request, spec)
                per_source[spec.name].append(time.perf_counter() - started)
        per_read = {name: n / rounds for name, n in sorted(queries.items())}
        builds: list[float] = []
        for _ in range(args.builds):
            request = request_for(rng.choice(orgs), rng)
            started = time.perf_counter()
            brief = await builder.build(request, POLICY)
            builds.append(time.perf_counter() - started)
            assert not brief.failed_sources, brief.failed_sources
    finally:
        await invalidator.stop()
        await pool.close()
    for name, timings in per_source.items():
        print(figures(name, timings))
    print(figures("whole build (5)", builds))
    print("queries per read (10 refs: 4 companies, 3 people, 3 deals):")
    for name, n in per_read.items():
        print(f"  {name:<40} {n:.2f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MB")
    await drop(seeded.stack, database)


if __name__ == "__main__":
    asyncio.run(main())
