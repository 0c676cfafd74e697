"""A seeded benchmark database with production credentials, shared by the benchmarks.

``prepare`` starts (or reuses) the embedded stack, provisions a database of its own, applies
the migrations as the owner and seeds it as the administrator (through COPY): per organization
4,000 companies, 4,000 people, 2,000 deals, 1,000 runs and 50 conversations of 20 messages.
Services then read it as the runtime login, as in production.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from broker.settings import TopicSettings
from broker.topics import all_topics
from contextcore.storage import migrations
from contextcore.storage.pool import with_database
from contextcore.storage.provision import provision_database
from devstack.stack import OWNER, DevStack, StackAddresses
from schemas.context import (
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)

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


TYPICAL_POLICY = ContextPolicy(
    total_token_budget=1200,
    sources=[
        ContextSourceSpec(name="conversation", token_budget=300),
        ContextSourceSpec(name="application", token_budget=400),
        ContextSourceSpec(name="dossier", token_budget=250, options={"include_user": True}),
        ContextSourceSpec(name="definition_summary", token_budget=100),
        ContextSourceSpec(name="run_history", token_budget=150),
    ],
)
"""The demo's policy: what one agent turn asks of all five sources."""


FULL_POLICY = ContextPolicy(
    total_token_budget=2_000,
    sources=[
        *TYPICAL_POLICY.sources,
        ContextSourceSpec(
            name="knowledge",
            token_budget=500,
            limit=4,
            options={"include_platform": True, "include_organization": True},
        ),
        ContextSourceSpec(name="memory", token_budget=250, limit=10),
    ],
)
"""Every one of the seven sources: the typical turn, the tenant's documents and its memory."""

DEFINITION = uuid.UUID("be000000-0000-4000-8000-00000000d001")
"""The agent whose memories the full workload reads."""


def request_for(org: Org, rng: random.Random, *, typical: bool = False) -> ContextRequest:
    """A turn about entities of ``org``: ten refs of three kinds (the heavy build of
    ``bench/sources.py``), or a typical turn's two (a company and a deal, as in the demo)."""
    if typical:
        entities = [
            ResourceRef(kind="crm.company", id=str(rng.choice(org.companies))),
            ResourceRef(kind="crm.deal", id=str(rng.choice(org.deals))),
        ]
    else:
        entities = [
            ResourceRef(kind="crm.company", id=str(c)) for c in rng.sample(org.companies, 4)
        ]
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


@dataclass(frozen=True)
class Seeded:
    stack: StackAddresses
    name: str
    orgs: list[Org]

    @property
    def url(self) -> str:
        """The runtime login on the bench database."""
        return with_database(self.stack.database_url, self.name)

    @property
    def admin_url(self) -> str:
        return with_database(self.stack.admin_url, self.name)

    @property
    def owner_url(self) -> str:
        """The schema owner on the bench database (what builds a tenant's index)."""
        return with_database(self.stack.owner_url, self.name)


async def prepare(name: str, organizations: int) -> Seeded:
    """A fresh, migrated, seeded database ``name`` on the embedded stack."""
    report = await DevStack().up(all_topics(TopicSettings()))
    stack = report.addresses
    await drop(stack, name)
    await provision_database(stack.admin_url, name, owner=OWNER)
    owner = await asyncpg.connect(with_database(stack.owner_url, name))
    try:
        await migrations.apply_pending(owner)
    finally:
        await owner.close()
    orgs = [Org() for _ in range(organizations)]
    started = time.perf_counter()
    admin = await asyncpg.connect(with_database(stack.admin_url, name))
    try:
        await seed(admin, orgs)
    finally:
        await admin.close()
    crm = sum(len(o.companies) + len(o.people) + len(o.deals) for o in orgs)
    print(
        f"seeded {len(orgs)} organizations, {crm:,} CRM rows, {len(orgs) * 1000:,} runs, "
        f"{len(orgs) * 50:,} conversations in {time.perf_counter() - started:.1f} s"
    )
    return Seeded(stack, name, orgs)


def database_name(name: str, smoke: bool) -> str:
    """The bench's database: ``name``, dropped and made again by each run; a smoke run's is a
    name of its own (two smoke runs at once, say two test sessions, never share one)."""
    return f"{name}_smoke_{uuid.uuid4().hex[:8]}" if smoke else name


async def drop(stack: StackAddresses, name: str) -> None:
    """Leave no million-row database behind."""
    admin = await asyncpg.connect(stack.admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
