"""The memory source on real PostgreSQL (issue 9; spec "Reading memory"): live revisions only,
the user and definition filters, the tenant guard through the application resolvers, one query
per ref kind, recency order and the cap."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from contextcore.builder import DefaultContextBuilder
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from contextcore.sources.application import ApplicationContextSource
from contextcore.sources.memory import MemoryContextSource
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from schemas.context import (
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)
from schemas.memory import Invoker, MemoryCandidate, MemorySubjectRef, Written
from tests.integration import seed
from tests.services import Database

pytestmark = pytest.mark.integration

DEFINITION = uuid.UUID("7c000000-0000-4000-8000-00000000d001")
OTHER_DEFINITION = uuid.UUID("7c000000-0000-4000-8000-00000000d002")
ALICE = uuid.UUID("7c000000-0000-4000-8000-00000000e001")
BOB = uuid.UUID("7c000000-0000-4000-8000-00000000e002")


class Reads:
    """Every statement the source's pool runs, and each drop the source reports."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.drops: list[str] = []

    def __call__(self, record: Any) -> None:
        self.queries.append(record.query)

    def of(self, prefix: str) -> list[str]:
        return [q for q in self.queries if q.lstrip().startswith(f"-- {prefix}")]


@pytest.fixture
async def reads() -> Reads:
    return Reads()


@pytest.fixture
async def pool(database: Database, reads: Reads) -> AsyncIterator[asyncpg.Pool]:
    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(reads)
        await conn.execute("SELECT set_config('role', $1, false)", SERVICE_ROLE)

    pool = await asyncpg.create_pool(database.url, min_size=1, max_size=4, init=init)
    assert pool is not None
    yield pool
    await pool.close()


@pytest.fixture
def source(pool: asyncpg.Pool, reads: Reads) -> MemoryContextSource:
    return MemoryContextSource(TenantDatabase(pool), on_drop=reads.drops.append)


@pytest.fixture
def service(pool: asyncpg.Pool) -> MemoryService:
    return MemoryService(PostgresMemoryJournal(TenantDatabase(pool)))


def subject(
    org: uuid.UUID, *, user: uuid.UUID | None = ALICE, definition: uuid.UUID | None = DEFINITION
) -> ContextRequest:
    return ContextRequest(
        subject=ContextSubject(
            organization_id=org,
            user_id=user,
            trigger_id=None if user is not None else uuid.uuid4(),
            definition_id=definition,
        ),
        query="ignored",
        entities=(),
    )


def spec(limit: int | None = None) -> ContextSourceSpec:
    return ContextSourceSpec(name="memory", token_budget=2000, limit=limit)


async def remember(
    service: MemoryService,
    org: uuid.UUID,
    text: str,
    *,
    attribute: str = "observation.note",
    scope: str = "organization",
    user: uuid.UUID | None = ALICE,
    definition: uuid.UUID = DEFINITION,
    ref: MemorySubjectRef | None = None,
) -> Written:
    invoker = Invoker(
        organization_id=org,
        definition_id=definition,
        user_id=user,
        trigger_id=None if user is not None else uuid.uuid4(),
    )
    candidate = MemoryCandidate.model_validate(
        {"scope": scope, "attribute": attribute, "text": text, "subject_refs": [ref] if ref else []}
    )
    answer = await service.remember(invoker, candidate, uuid.uuid4().hex)
    assert isinstance(answer, Written), answer
    return answer


async def test_old_revisions_and_tombstones_never_reach_a_brief(
    admin: asyncpg.Connection, service: MemoryService, source: MemoryContextSource
) -> None:
    org = await seed.organization(admin)
    await remember(service, org, "British English", attribute="preference.language")
    current = await remember(service, org, "American English", attribute="preference.language")
    gone = await remember(service, org, "Meets on Fridays", attribute="observation.cadence")
    invoker = Invoker(organization_id=org, definition_id=DEFINITION, user_id=ALICE)
    assert isinstance(await service.forget(invoker, gone.memory.id, "forget-1"), Written)
    items = await source.retrieve(subject(org), spec())
    assert [(i.body, i.ref) for i in items] == [
        ("American English", ResourceRef(kind="memory", id=str(current.memory.id)))
    ]
    assert items[0].subject_key == f"organization:{org}:preference.language"


async def test_user_chains_kinds_and_a_trigger_reading_organization_memory_alone(
    admin: asyncpg.Connection, service: MemoryService, source: MemoryContextSource
) -> None:
    org = await seed.organization(admin)
    await remember(service, org, "shared fact")
    await remember(service, org, "Alice likes bullet points", scope="user", user=ALICE)
    await remember(service, org, "Bob likes prose", scope="user", user=BOB)
    alice = await source.retrieve(subject(org, user=ALICE), spec())
    assert {(i.kind, i.body) for i in alice} == {
        ("memory", "shared fact"),
        ("personal_memory", "Alice likes bullet points"),
    }
    bob = await source.retrieve(subject(org, user=BOB), spec())
    assert "Alice likes bullet points" not in {i.body for i in bob}
    trigger = await source.retrieve(subject(org, user=None), spec())
    assert [(i.kind, i.body) for i in trigger] == [("memory", "shared fact")]


async def test_a_subject_without_a_definition_reads_every_definition_and_nothing_wider(
    admin: asyncpg.Connection, service: MemoryService, source: MemoryContextSource
) -> None:
    org = await seed.organization(admin)
    other_org = await seed.organization(admin)
    await remember(service, org, "from the first agent", definition=DEFINITION)
    await remember(service, org, "from the second agent", definition=OTHER_DEFINITION)
    await remember(service, org, "Bob's own", scope="user", user=BOB, definition=OTHER_DEFINITION)
    await remember(service, other_org, "another tenant's")
    one = await source.retrieve(subject(org, definition=DEFINITION), spec())
    assert [i.body for i in one] == ["from the first agent"]
    every = await source.retrieve(subject(org, definition=None), spec())
    assert {i.body for i in every} == {"from the first agent", "from the second agent"}


async def test_the_tenant_guard_drops_what_does_not_resolve_in_one_statement(
    admin: asyncpg.Connection,
    service: MemoryService,
    source: MemoryContextSource,
    reads: Reads,
) -> None:
    org = await seed.organization(admin)
    other_org = await seed.organization(admin)
    acme = await seed.company(admin, org, name="Acme", lifecycle_stage="customer")
    globex = await seed.company(admin, org, name="Globex")
    deleted = await seed.company(admin, org, name="Gone")
    await admin.execute("UPDATE crm_companies SET deleted_at = now() WHERE id = $1", deleted)
    theirs = await seed.company(admin, other_org, name="Theirs")
    person = seed.new_id()
    await seed.insert(admin, "crm_people", organization_id=org, id=person, full_name="Ada")

    def company(row: uuid.UUID | str, kind: str = "crm.company") -> MemorySubjectRef:
        return MemorySubjectRef(kind=kind, id=str(row))

    kept = [
        await remember(service, org, "Acme buys through a portal", ref=company(acme)),
        await remember(service, org, "Globex renews in March", ref=company(globex)),
        await remember(service, org, "Ada prefers email", ref=company(person, "crm.person")),
        await remember(service, org, "no subject at all"),
    ]
    for text, ref in [
        ("about another tenant's row", company(theirs)),
        ("about a deleted row", company(deleted)),
        ("about a row that never existed", company(uuid.uuid4())),
        ("about an id that is no row id", company("not-a-uuid")),
        ("about a kind no resolver owns", company(acme, "crm.unicorn")),
    ]:
        await remember(service, org, text, ref=ref)
    reads.queries.clear()
    items = await source.retrieve(subject(org), spec())
    assert {i.body for i in items} == {w.memory.text for w in kept}
    assert sorted(reads.drops) == ["unknown_kind"] + ["unresolved_ref"] * 4
    assert len(reads.of("application.read:")) == 1  # every kind in one statement
    assert len(reads.of("memory.")) == 1
    # each its own statement, which enters its scope itself: no transaction around them
    assert not [q for q in reads.queries if q.startswith(("BEGIN", "COMMIT"))]
    acme_item = next(i for i in items if i.body == "Acme buys through a portal")
    assert acme_item.body_refs == [ResourceRef(kind="crm.company", id=str(acme))]


async def test_a_ref_naming_the_scope_owner_is_a_memory_about_it_never_dropped(
    admin: asyncpg.Connection, service: MemoryService, source: MemoryContextSource, reads: Reads
) -> None:
    """CLARIFICATIONS 16. Before, the write was answered ``superseded`` and the read dropped the
    new revision as ``unknown_kind``: the memory and the one it replaced both vanished."""
    org = await seed.organization(admin)
    await remember(service, org, "British English", attribute="preference.language")
    changed = await remember(
        service,
        org,
        "American English",
        attribute="preference.language",
        ref=MemorySubjectRef(kind="organization", id=str(org).upper()),
    )
    assert changed.change == "superseded"
    assert changed.memory.subject_refs == []
    # a row stored before the write path dropped such a ref: read as no ref
    await admin.execute(
        "INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key, text,"
        " subject_refs) VALUES ($1, $2, 'user', $3, $4, 'Alice reads on paper', $5::jsonb)",
        org,
        DEFINITION,
        ALICE,
        f"user:{ALICE}:preference.medium",
        json.dumps([{"kind": "user", "id": str(ALICE)}]),
    )
    items = await source.retrieve(subject(org, user=ALICE), spec())
    assert {(i.kind, i.body) for i in items} == {
        ("memory", "American English"),
        ("personal_memory", "Alice reads on paper"),
    }
    assert reads.drops == []
    # an organization memory naming a user is not about the organization: still dropped
    await admin.execute(
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
        " subject_refs) VALUES ($1, $2, 'organization', $3, 'about Alice', $4::jsonb)",
        org,
        DEFINITION,
        f"user:{ALICE}:observation.leave",
        json.dumps([{"kind": "user", "id": str(ALICE)}]),
    )
    alice = await source.retrieve(subject(org, user=ALICE), spec())
    assert "about Alice" not in {i.body for i in alice}
    assert reads.drops == ["unknown_kind"]


async def test_newest_first_the_cap_and_a_zero_limit_that_reads_nothing(
    admin: asyncpg.Connection,
    service: MemoryService,
    source: MemoryContextSource,
    reads: Reads,
) -> None:
    org = await seed.organization(admin)
    for i in range(25):
        await remember(service, org, f"fact {i}", attribute=f"observation.fact_{i}")
    default = await source.retrieve(subject(org), spec())
    assert [i.body for i in default] == [f"fact {i}" for i in range(24, 4, -1)]  # 20, newest first
    assert [i.body for i in await source.retrieve(subject(org), spec(3))] == [
        "fact 24",
        "fact 23",
        "fact 22",
    ]
    reads.queries.clear()
    assert await source.retrieve(subject(org), spec(0)) == []
    assert reads.queries == []


async def test_a_buying_process_memory_survives_a_lifecycle_row_of_the_same_company(
    admin: asyncpg.Connection, service: MemoryService, pool: asyncpg.Pool
) -> None:
    org = await seed.organization(admin)
    acme = await seed.company(admin, org, name="Acme", lifecycle_stage="customer")
    await remember(
        service,
        org,
        "Acme buys through a procurement portal",
        attribute="observation.buying_process",
        ref=MemorySubjectRef(kind="crm.company", id=str(acme)),
    )
    database = TenantDatabase(pool)
    builder = DefaultContextBuilder(
        ContextSourceRegistry([ApplicationContextSource(database), MemoryContextSource(database)]),
        ContextPacker(),
    )
    request = subject(org).model_copy(
        update={"entities": (ResourceRef(kind="crm.company", id=str(acme)),)}
    )
    policy = ContextPolicy(
        total_token_budget=2000,
        sources=[
            ContextSourceSpec(name="application", token_budget=1000),
            ContextSourceSpec(name="memory", token_budget=500),
        ],
    )
    brief = await builder.build(request, policy)
    assert "lifecycle_stage" in brief.text
    assert "Acme buys through a procurement portal" in brief.text
    assert brief.dropped == {"application": 0, "memory": 0}
