"""Source and whole-build latency on a seeded database, in process (no Kafka).

Seeds a fresh database (``bench_sources``) with 100 organizations, each with 10,000 CRM rows
(4,000 companies, 4,000 people, 2,000 deals), 1,000 runs and 50 conversations of 20 messages,
through COPY. Then, for random organizations, it reads each of the five sources and whole
``build`` calls (all five, concurrently, through the tenancy layer and RLS) and prints p50/p99,
the queries each source sent, and the process's peak RSS. Prints figures; never passes or fails.

    .venv/bin/python bench/sources.py [--organizations 100] [--builds 500]

Target (issue 4): p99 of a whole build under 15 ms on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from consumers.devstack import DevStack
from consumers.sources import process_registry
from consumers.topics import all_topics
from contextcore.builder import DefaultContextBuilder
from contextcore.models import (
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)
from contextcore.packer import ContextPacker
from contextcore.settings import Settings
from contextcore.sources.dossier import Fact
from contextcore.sources.dossier_cache import DossierCache, DossierInvalidator
from contextcore.storage import migrations
from contextcore.storage.tenancy import TenantDatabase

DATABASE = "bench_sources"
POLICY = ContextPolicy(
    total_token_budget=4000,
    sources=[
        ContextSourceSpec(name="conversation", token_budget=800),
        ContextSourceSpec(name="application", token_budget=1500),
        ContextSourceSpec(name="dossier", token_budget=600, options={"include_user": True}),
        ContextSourceSpec(name="definition_summary", token_budget=300),
        ContextSourceSpec(name="run_history", token_budget=500),
    ],
)


class Org:
    def __init__(self) -> None:
        self.id = uuid.uuid4()
        self.user = uuid.uuid4()
        self.companies = [uuid.uuid4() for _ in range(4000)]
        self.people = [uuid.uuid4() for _ in range(4000)]
        self.deals = [uuid.uuid4() for _ in range(2000)]
        self.conversations = [uuid.uuid4() for _ in range(50)]


async def seed(conn: asyncpg.Connection, orgs: list[Org]) -> None:
    now = datetime.now(UTC)
    for org in orgs:
        o = org.id
        await conn.execute("INSERT INTO organizations (id, name) VALUES ($1, $2)", o, "Org")
        await conn.execute(
            "INSERT INTO company_profiles (organization_id, company_name, industry) "
            "VALUES ($1, 'Bench Co', 'Software')",
            o,
        )
        await conn.execute(
            "INSERT INTO organization_members (organization_id, user_id, full_name) "
            "VALUES ($1, $2, 'Bench User')",
            o,
            org.user,
        )
        await conn.copy_records_to_table(
            "offers",
            columns=["organization_id", "id", "name"],
            records=[(o, uuid.uuid4(), f"Offer {i}") for i in range(3)],
        )
        await conn.copy_records_to_table(
            "crm_companies",
            columns=[
                "organization_id",
                "id",
                "name",
                "domain",
                "industry",
                "lifecycle_stage",
                "employee_count",
            ],
            records=[
                (o, c, f"Company {i}", f"c{i}.example", "Retail", "lead", i)
                for i, c in enumerate(org.companies)
            ],
        )
        await conn.copy_records_to_table(
            "crm_people",
            columns=["organization_id", "id", "full_name", "email", "current_title", "company_id"],
            records=[
                (o, p, f"Person {i}", f"p{i}@example.com", "Buyer", org.companies[i % 4000])
                for i, p in enumerate(org.people)
            ],
        )
        await conn.copy_records_to_table(
            "crm_deals",
            columns=["organization_id", "id", "name", "stage", "amount", "company_id"],
            records=[
                (o, d, f"Deal {i}", "proposal", i * 100, org.companies[i % 4000])
                for i, d in enumerate(org.deals)
            ],
        )
        await conn.copy_records_to_table(
            "runs",
            columns=[
                "organization_id",
                "id",
                "user_id",
                "status",
                "result_summary",
                "result_refs",
                "created_at",
            ],
            records=[
                (
                    o,
                    uuid.uuid4(),
                    org.user if i % 3 == 0 else uuid.uuid4(),
                    "completed",
                    f"Run {i}",
                    json.dumps([{"kind": "crm_deal", "id": str(org.deals[i % 2000])}]),
                    now - timedelta(minutes=i * 3),
                )
                for i in range(1000)
            ],
        )
        await conn.copy_records_to_table(
            "conversations",
            columns=["organization_id", "id", "user_id", "summary"],
            records=[(o, c, org.user, "A summary") for c in org.conversations],
        )
        await conn.copy_records_to_table(
            "conversation_messages",
            columns=["organization_id", "id", "conversation_id", "role", "content", "created_at"],
            records=[
                (
                    o,
                    uuid.uuid4(),
                    c,
                    "user" if i % 2 else "assistant",
                    f"Message {i}",
                    now - timedelta(seconds=i),
                )
                for c in org.conversations
                for i in range(20)
            ],
        )
    await conn.execute("ANALYZE")


def request_for(org: Org, rng: random.Random) -> ContextRequest:
    entities = [ResourceRef(kind="crm.company", id=str(c)) for c in rng.sample(org.companies, 4)]
    entities += [ResourceRef(kind="crm.person", id=str(p)) for p in rng.sample(org.people, 3)]
    entities += [ResourceRef(kind="crm.deal", id=str(d)) for d in rng.sample(org.deals, 3)]
    return ContextRequest(
        subject=ContextSubject(
            organization_id=org.id, user_id=org.user, trigger_id=None, definition_id=None
        ),
        query="bench",
        entities=tuple(entities),
        conversation_id=rng.choice(org.conversations),
    )


def figures(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{label:<20} p50 {statistics.median(ms):6.2f} ms   p99 {p99:6.2f} ms   n={len(ms)}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--organizations", type=int, default=100)
    parser.add_argument("--builds", type=int, default=500)
    args = parser.parse_args()

    report = await DevStack().up(all_topics(Settings()))
    admin_url = report.addresses.database_url.rsplit("/", 1)[0] + "/postgres"
    url = report.addresses.database_url.rsplit("/", 1)[0] + f"/{DATABASE}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    await admin.execute(f"CREATE DATABASE {DATABASE}")
    await admin.close()
    owner = await asyncpg.connect(url)
    await migrations.apply_pending(owner)
    orgs = [Org() for _ in range(args.organizations)]
    started = time.perf_counter()
    await seed(owner, orgs)
    crm = sum(len(o.companies) + len(o.people) + len(o.deals) for o in orgs)
    print(
        f"seeded {len(orgs)} organizations, {crm:,} CRM rows, {len(orgs) * 1000:,} runs, "
        f"{len(orgs) * 50:,} conversations in {time.perf_counter() - started:.1f} s"
    )
    await owner.close()

    queries: dict[str, int] = {}

    def count(record: Any) -> None:
        head = record.query.lstrip().split(":", 1)[0]
        if head.startswith("-- "):
            queries[head[3:]] = queries.get(head[3:], 0) + 1

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(count)

    pool = await asyncpg.create_pool(url, min_size=5, max_size=10, init=init)
    assert pool is not None
    cache: DossierCache[list[Fact]] = DossierCache()
    invalidator = DossierInvalidator(cache, url)
    await invalidator.start()
    registry = process_registry(TenantDatabase(pool), cache)
    builder = DefaultContextBuilder(registry, ContextPacker())
    rng = random.Random(7)
    try:
        for _ in range(50):  # warm-up: connections, plans, the dossier cache of a few orgs
            await builder.build(request_for(rng.choice(orgs), rng), POLICY)
        per_source: dict[str, list[float]] = {spec.name: [] for spec in POLICY.sources}
        queries.clear()
        rounds = 200
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
    admin = await asyncpg.connect(admin_url)  # leave no million-row database behind
    await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
