"""Agent memory on real PostgreSQL: the database protects the chain, RLS keeps the tenant, and
MemoryService applies every rule of the spec (issue 9; spec "Minimum contract tests")."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from datetime import timedelta

import asyncpg
import pytest

from contextcore.memory.adapters import store
from contextcore.memory.adapters.health import health
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import MemoryService, remember_write
from contextcore.storage.tenancy import TenantDatabase
from schemas.memory import Invoker, MemoryCandidate, MemorySubjectRef, Refusal, Written
from tests.integration.helpers import as_service_role
from tests.services import Database

pytestmark = pytest.mark.integration

ORG_A = uuid.UUID("7a000000-0000-4000-8000-0000000000a1")
ORG_B = uuid.UUID("7a000000-0000-4000-8000-0000000000b1")
DEFINITION = uuid.UUID("7a000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7a000000-0000-4000-8000-00000000e001")


@pytest.fixture
async def tenants(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )


@pytest.fixture
def service(tenant_db: TenantDatabase) -> MemoryService:
    return MemoryService(PostgresMemoryJournal(tenant_db))


def user(org: uuid.UUID = ORG_A, **changes: object) -> Invoker:
    return Invoker(organization_id=org, definition_id=DEFINITION, user_id=USER).model_copy(
        update=changes
    )


def trigger(org: uuid.UUID = ORG_A) -> Invoker:
    return Invoker(organization_id=org, definition_id=DEFINITION, trigger_id=uuid.uuid4())


def candidate(
    text: str, attribute: str = "preference.language", **changes: object
) -> MemoryCandidate:
    return MemoryCandidate(scope="user", attribute=attribute, text=text).model_copy(update=changes)


def key() -> str:
    return uuid.uuid4().hex


async def chain(admin: asyncpg.Connection, org: uuid.UUID, attribute: str) -> list[asyncpg.Record]:
    return await admin.fetch(
        "SELECT id, supersedes_id, text, forgotten_at FROM memories"
        " WHERE organization_id = $1 AND subject_key LIKE '%:' || $2",
        org,
        attribute,
    )


def written(answer: object) -> Written:
    assert isinstance(answer, Written), answer
    return answer


def refused(answer: object, reason: str) -> Refusal:
    assert isinstance(answer, Refusal), answer
    assert answer.reason == reason, answer
    return answer


# ------------------------------------------------------------------ the database protects it


async def raw_root(admin: asyncpg.Connection, text: str = "root") -> uuid.UUID:
    row_id: uuid.UUID = await admin.fetchval(
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
        " VALUES ($1, $2, 'organization',"
        " 'organization:' || $1::uuid::text || ':observation.raw', $3)"
        " RETURNING id",
        ORG_A,
        DEFINITION,
        text,
    )
    return row_id


@pytest.mark.usefixtures("tenants")
async def test_raw_sql_cannot_give_a_revision_two_children_or_a_chain_two_roots(
    admin: asyncpg.Connection,
) -> None:
    root = await raw_root(admin)
    child = (
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
        " supersedes_id) VALUES ($1, $2, 'organization', 'organization:' || $1::uuid::text ||"
        " ':observation.raw', $3, $4)"
    )
    await admin.execute(child, ORG_A, DEFINITION, "first child", root)
    with pytest.raises(asyncpg.UniqueViolationError, match="memories_one_child"):
        await admin.execute(child, ORG_A, DEFINITION, "second child", root)
    with pytest.raises(asyncpg.UniqueViolationError, match="memories_one_root"):
        await raw_root(admin, "a second root")


@pytest.mark.usefixtures("tenants")
async def test_raw_sql_cannot_change_a_revision_or_let_a_child_leave_its_chain(
    admin: asyncpg.Connection,
) -> None:
    root = await raw_root(admin)
    with pytest.raises(asyncpg.PostgresError, match="append only"):
        await admin.execute("UPDATE memories SET organization_id = $1 WHERE id = $2", ORG_B, root)
    with pytest.raises(asyncpg.PostgresError, match="append only"):
        await admin.execute("UPDATE memories SET text = 'edited' WHERE id = $1", root)
    # a child naming another organization, definition, scope, user or key is refused
    leave = {
        "organization": (ORG_B, DEFINITION, "organization", None, f"organization:{ORG_B}"),
        "definition": (ORG_A, uuid.uuid4(), "organization", None, f"organization:{ORG_A}"),
        "scope and user": (ORG_A, DEFINITION, "user", USER, f"user:{USER}"),
    }
    for what, (org, definition, scope, user_id, owner) in leave.items():
        with pytest.raises(asyncpg.ForeignKeyViolationError), _named(what):
            await admin.execute(
                "INSERT INTO memories (organization_id, definition_id, scope, user_id,"
                " subject_key, text, supersedes_id) VALUES ($1, $2, $3, $4, $5, 'moved', $6)",
                org,
                definition,
                scope,
                user_id,
                f"{owner}:observation.raw",
                root,
            )
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await admin.execute(
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
            " supersedes_id) VALUES ($1, $2, 'organization', 'organization:' || $1::uuid::text ||"
            " ':observation.other', 'another key', $3)",
            ORG_A,
            DEFINITION,
            root,
        )


class _named:
    """Names the case in a failure message (pytest.raises does not)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            raise AssertionError(f"{self.what}: the database accepted it")


@pytest.mark.parametrize(
    "refs",
    [
        [{"kind": "crm.company", "id": "a"}, {"kind": "crm.company", "id": "b"}],
        [{"kind": "\t", "id": "x"}],
        [{"kind": "crm.company", "id": "\u00a0\u2003"}],
        [{"kind": "crm:company", "id": "x"}],
        [{"kind": "crm.company"}],
        [{"kind": "crm.company", "id": 7}],
        ["crm.company"],
        {"kind": "crm.company", "id": "x"},
    ],
    ids=["two", "tab", "no-break-spaces", "colon", "no-id", "number-id", "not-object", "object"],
)
@pytest.mark.usefixtures("tenants")
async def test_the_table_refuses_a_malformed_subject_ref(
    admin: asyncpg.Connection, refs: object
) -> None:
    assert (
        await admin.fetchval("SELECT memory_subject_refs_valid($1::jsonb)", json.dumps(refs))
        is False
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
            " subject_refs) VALUES ($1, $2, 'organization', 'crm.company:x:observation.a',"
            " 'text', $3::jsonb)",
            ORG_A,
            DEFINITION,
            json.dumps(refs),
        )


@pytest.mark.usefixtures("tenants")
async def test_the_table_refuses_keys_outside_the_memory_namespaces_and_blank_text(
    admin: asyncpg.Connection,
) -> None:
    insert = (
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
        " VALUES ($1, $2, 'organization', 'organization:' || $1::uuid::text || ':' || $3, $4)"
    )
    with pytest.raises(asyncpg.CheckViolationError, match="memories_subject_key_shape"):
        await admin.execute(insert, ORG_A, DEFINITION, "lifecycle_stage", "customer")
    with pytest.raises(asyncpg.CheckViolationError, match="memories_text_not_blank"):
        await admin.execute(insert, ORG_A, DEFINITION, "observation.x", "\u3000\t")
    with pytest.raises(asyncpg.CheckViolationError, match="memories_key_names_its_subject"):
        await admin.execute(
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
            " VALUES ($1, $2, 'organization',"
            " 'organization:' || $3::uuid::text || ':observation.x', 't')",
            ORG_A,
            DEFINITION,
            ORG_B,
        )


@pytest.mark.usefixtures("tenants")
async def test_the_runtime_login_reads_and_appends_only_its_organizations_memories(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    written(await service.remember(user(ORG_B), candidate("B's secret"), key()))
    await service.count_unjournaled_refusal(ORG_B, "remember")
    assert await admin.fetchval("SELECT count(*) FROM memory_refusals") == 1
    runtime = await asyncpg.connect(database.url)
    try:
        async with runtime.transaction():
            await as_service_role(runtime, ORG_A)
            for relation in (
                "memories",
                "memory_heads",
                "live_memories",
                "memory_writes",
                "memory_refusals",
            ):
                assert await runtime.fetchval(f"SELECT count(*) FROM {relation}") == 0, relation
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await runtime.execute(
                    "INSERT INTO memories (organization_id, definition_id, scope, subject_key,"
                    " text) VALUES ($1, $2, 'organization', 'organization:' || $1::uuid::text ||"
                    " ':observation.x', 'planted')",
                    ORG_B,
                    DEFINITION,
                )
        for statement in ("UPDATE memories SET text = 'x'", "DELETE FROM memories"):
            async with runtime.transaction():
                await as_service_role(runtime)
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await runtime.execute(statement)
    finally:
        await runtime.close()
    assert [r["text"] for r in await chain(admin, ORG_B, "preference.language")] == ["B's secret"]


# ------------------------------------------------------------------ MemoryService's rules


@pytest.mark.usefixtures("tenants")
async def test_supersede_duplicate_forget_and_revive_form_one_chain(
    admin: asyncpg.Connection, service: MemoryService
) -> None:
    first = written(await service.remember(user(), candidate("Write in British English"), key()))
    assert first.change == "created"
    assert first.memory.subject_key == f"user:{USER}:preference.language"
    refused(
        await service.remember(user(), candidate("Write in British English"), key()), "duplicate"
    )
    second = written(await service.remember(user(), candidate("Write in American English"), key()))
    assert (second.change, second.memory.supersedes_id) == ("superseded", first.memory.id)
    refused(await service.forget(user(), first.memory.id, key()), "not_live")  # an old revision
    tombstone = written(await service.forget(user(), second.memory.id, key()))
    assert (tombstone.change, tombstone.memory.text) == ("forgotten", None)
    assert tombstone.memory.forgotten_at is not None
    refused(await service.forget(user(), tombstone.memory.id, key()), "not_live")  # a tombstone
    revived = written(await service.remember(user(), candidate("Write in British English"), key()))
    assert (revived.change, revived.memory.supersedes_id) == ("revived", tombstone.memory.id)
    rows = await chain(admin, ORG_A, "preference.language")
    assert len(rows) == 4
    assert sum(r["supersedes_id"] is None for r in rows) == 1
    live = await admin.fetch("SELECT id FROM live_memories WHERE organization_id = $1", ORG_A)
    assert [r["id"] for r in live] == [revived.memory.id]


@pytest.mark.usefixtures("tenants")
async def test_refusals_namespace_trigger_user_scope_workflow_node_and_owner(
    service: MemoryService,
) -> None:
    refused(await service.remember(user(), candidate("x", "lifecycle_stage"), key()), "namespace")
    refused(await service.remember(user(), candidate("x", "observation."), key()), "namespace")
    refused(await service.remember(trigger(), candidate("x"), key()), "trigger_user_scope")
    refused(
        await service.remember(user(workflow_node=True), candidate("x"), key()), "workflow_node"
    )
    mine = written(await service.remember(user(), candidate("mine"), key()))
    other_user = user(user_id=uuid.uuid4())
    refused(await service.forget(other_user, mine.memory.id, key()), "not_owner")
    refused(await service.forget(trigger(), mine.memory.id, key()), "not_owner")
    refused(
        await service.forget(user(definition_id=uuid.uuid4()), mine.memory.id, key()), "not_owner"
    )
    refused(await service.forget(user(ORG_B), mine.memory.id, key()), "not_live")  # not B's row
    refused(await service.forget(user(workflow_node=True), mine.memory.id, key()), "workflow_node")
    # a trigger writes organization scope, keyed by the organization
    shared = candidate(
        "the buying committee meets on Mondays", "observation.cadence", scope="organization"
    )
    answer = written(await service.remember(trigger(), shared, key()))
    assert answer.memory.subject_key == f"organization:{ORG_A}:observation.cadence"
    assert answer.memory.user_id is None


@pytest.mark.usefixtures("tenants")
async def test_a_subject_ref_makes_the_key_and_an_application_field_never_collides(
    service: MemoryService,
) -> None:
    company = str(uuid.uuid4())
    about = candidate(
        "Buys through a procurement portal",
        "observation.buying_process",
        scope="organization",
        subject_refs=[MemorySubjectRef(kind="crm.company", id=company, label="Acme: EU")],
    )
    answer = written(await service.remember(user(), about, key()))
    assert answer.memory.subject_key == f"crm.company:{company}:observation.buying_process"
    assert answer.memory.subject_key != f"crm.company:{company}:lifecycle_stage"
    assert answer.memory.subject_refs[0].label == "Acme: EU"


@pytest.mark.usefixtures("tenants")
async def test_one_idempotency_key_is_one_answer_and_one_row(
    admin: asyncpg.Connection, service: MemoryService
) -> None:
    once = key()
    answers = await asyncio.gather(
        *(service.remember(user(), candidate("same call"), once) for _ in range(5))
    )
    assert len({a.model_dump_json(exclude={"replayed", "chain_length"}) for a in answers}) == 1
    assert sum(not a.replayed for a in answers) == 1  # one appended, four answered from the journal
    assert len(await chain(admin, ORG_A, "preference.language")) == 1
    # a refusal is journaled too: the same key is the same refusal
    again = key()
    duplicate = refused(await service.remember(user(), candidate("same call"), again), "duplicate")
    replayed = await service.remember(user(), candidate("same call"), again)
    assert replayed == duplicate.model_copy(update={"replayed": True})
    reused = refused(
        await service.remember(user(), candidate("another call"), once), "invalid_input"
    )
    assert once in reused.message
    assert len(await chain(admin, ORG_A, "preference.language")) == 1


@pytest.mark.usefixtures("tenants")
async def test_writers_racing_on_one_chain_form_one_linear_chain(
    admin: asyncpg.Connection, database: Database
) -> None:
    """Every call in a transaction of its own (a batch of one), eight at a time, remembers and
    forgets of the live head mixed: they overlap for real. The deterministic races, one per
    rule, and their failure without the rule are in test_memory_rules."""
    pool = await asyncpg.create_pool(database.url, min_size=8, max_size=8)
    assert pool is not None
    try:
        service = MemoryService(
            PostgresMemoryJournal(TenantDatabase(pool)), max_batch=1, concurrency=8
        )
        root = written(await service.remember(user(), candidate("root", "observation.race"), key()))
        calls = [
            service.remember(user(), candidate(f"text {i % 7}", "observation.race"), key())
            for i in range(48)
        ]
        calls += [service.forget(user(), root.memory.id, key()) for _ in range(4)]
        answers = [root, *await asyncio.gather(*calls)]
    finally:
        await pool.close()
    outcomes = Counter(a.change if isinstance(a, Written) else a.reason for a in answers)
    rows = await chain(admin, ORG_A, "observation.race")
    assert outcomes["created"] == 1
    assert outcomes["forgotten"] <= 1  # the root is live once
    appended = outcomes["created"] + outcomes["superseded"] + outcomes["revived"]
    assert len(rows) == appended + outcomes["forgotten"]
    roots = [r for r in rows if r["supersedes_id"] is None]
    parents = [r["supersedes_id"] for r in rows if r["supersedes_id"] is not None]
    assert len(roots) == 1
    assert len(parents) == len(set(parents))
    heads = await admin.fetch(
        "SELECT id FROM memory_heads WHERE organization_id = $1 AND subject_key LIKE '%race'", ORG_A
    )
    assert len(heads) == 1
    # walking back from the head visits every row: one linear chain
    by_id = {r["id"]: r for r in rows}
    walked, current = 0, heads[0]["id"]
    while current is not None:
        walked += 1
        current = by_id[current]["supersedes_id"]
    assert walked == len(rows)


@pytest.mark.usefixtures("tenants")
async def test_each_write_answers_its_chain_length_and_a_replay_none(
    service: MemoryService,
) -> None:
    """Migration 00026: what the memory consumer's ``contextcore_memory_chain_length``
    histogram observes."""
    first = written(await service.remember(user(), candidate("one"), key()))
    again = key()
    second = written(await service.remember(user(), candidate("two"), again))
    gone = written(await service.forget(user(), second.memory.id, key()))
    other = written(await service.remember(user(), candidate("x", "observation.other"), key()))
    replay = written(await service.remember(user(), candidate("two"), again))
    assert [a.chain_length for a in (first, second, gone, other)] == [1, 2, 3, 1]
    assert replay.replayed
    assert replay.chain_length is None


@pytest.mark.usefixtures("tenants")
async def test_health_counts_what_the_memory_source_drops_at_read_per_organization(
    admin: asyncpg.Connection, service: MemoryService, tenant_db: TenantDatabase
) -> None:
    async def about(org: uuid.UUID, kind: str, row: str, attribute: str) -> None:
        ref = MemorySubjectRef(kind=kind, id=row)
        written(
            await service.remember(user(org), candidate("t", attribute, subject_refs=[ref]), key())
        )

    await about(ORG_A, "crm.unicorn", "x", "observation.a")
    await about(ORG_A, "crm.company", str(uuid.uuid4()), "observation.b")
    await about(ORG_A, "crm.company", "not-a-uuid", "observation.c")
    await about(ORG_B, "crm.unicorn", "x", "observation.a")
    written(await service.remember(user(), candidate("no subject"), key()))
    report = await health(tenant_db, ORG_A, timedelta(days=1))
    assert report.dropped_at_read == {"unknown_kind": 1, "unresolved_ref": 2}
    other = await health(tenant_db, ORG_B, timedelta(days=1))
    assert other.dropped_at_read == {"unknown_kind": 1}


@pytest.mark.usefixtures("tenants")
async def test_what_the_database_refuses_is_answered_not_retried(
    admin: asyncpg.Connection, service: MemoryService
) -> None:
    nowhere = user(uuid.uuid4())  # an organization that does not exist
    answer = refused(await service.remember(nowhere, candidate("x"), key()), "invalid_input")
    assert answer.message == "no such organization"  # no database name reaches the caller
    assert await admin.fetchval("SELECT count(*) FROM memory_writes") == 0
    assert await admin.fetchval("SELECT count(*) FROM memories") == 0


@pytest.mark.usefixtures("tenants")
async def test_one_row_id_in_two_spellings_is_one_chain(service: MemoryService) -> None:
    row = uuid.uuid4()
    spellings = [row.hex.upper(), str(row), f"{{{row}}}"]
    answers = [
        await service.remember(
            user(),
            candidate(
                "renews in March",
                "observation.renewal",
                scope="organization",
                subject_refs=[MemorySubjectRef(kind="crm.company", id=spelling)],
            ),
            key(),
        )
        for spelling in spellings
    ]
    first = written(answers[0])
    assert first.memory.subject_key == f"crm.company:{row}:observation.renewal"
    assert first.memory.subject_refs[0].id == str(row)
    for answer in answers[1:]:
        refused(answer, "duplicate")


@pytest.mark.usefixtures("tenants")
async def test_the_runtime_login_writes_memory_only_through_memory_apply(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    """Migration 00024. Before it, a plain INSERT of a child of the head (no journal row, its
    parent's text again: the duplicate rule skipped) and a planted journal answer were both
    accepted from the service role in its own scope."""
    once = key()
    head = written(await service.remember(user(), candidate("kept"), once)).memory
    unused = key()
    attempts = {
        "a child of the head, the parent's text again": (
            "INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,"
            " text, subject_refs, supersedes_id) VALUES ($1, $2, 'user', $3, $4, 'kept', '[]', $5)",
            (ORG_A, DEFINITION, USER, head.subject_key, head.id),
        ),
        "a root of a new chain": (
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
            " VALUES ($1, $2, 'organization', $3, 'sneaked')",
            (ORG_A, DEFINITION, f"organization:{ORG_A}:observation.sneak"),
        ),
        "backdated": (
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
            " created_at) VALUES ($1, $2, 'organization', $3, 'old', now() - interval '1y')",
            (ORG_A, DEFINITION, f"organization:{ORG_A}:observation.sneak"),
        ),
        "a journal answer for a key not yet used": (
            "INSERT INTO memory_writes (organization_id, idempotency_key, request_sha256,"
            " operation, outcome, reason, message) VALUES ($1, $2, repeat('0', 64), 'remember',"
            " 'refused', 'duplicate', 'planted')",
            (ORG_A, unused),
        ),
        "a journal answer rewritten": (
            "UPDATE memory_writes SET outcome = 'refused', reason = 'duplicate'"
            " WHERE idempotency_key = $1",
            (once,),
        ),
        "the journal emptied": ("DELETE FROM memory_writes", ()),
        "memory_apply_one called past memory_apply's lock": (
            "SELECT * FROM memory_apply_one($1::jsonb)",
            (json.dumps(remember_write(user(), candidate("direct"), unused)),),
        ),
        "the chain emptied": ("DELETE FROM memories", ()),
    }
    runtime = await asyncpg.connect(database.url)
    try:
        for what, (statement, args) in attempts.items():
            async with runtime.transaction():
                await as_service_role(runtime, ORG_A)
                with pytest.raises(asyncpg.InsufficientPrivilegeError), _named(what):
                    await runtime.execute(statement, *args)
    finally:
        await runtime.close()
    # memory_apply still writes both, in one transaction, and the unused key is still unused
    later = written(await service.remember(user(), candidate("changed"), unused))
    assert later.change == "superseded"
    assert not later.replayed
    assert await admin.fetchval("SELECT count(*) FROM memories") == 2
    assert await admin.fetchval("SELECT count(*) FROM memory_writes") == 2


@pytest.mark.usefixtures("tenants")
async def test_no_role_roots_a_tombstone_or_rewrites_an_answer(
    admin: asyncpg.Connection, service: MemoryService
) -> None:
    """The table's own rules, which hold for every role that can write (the superuser here)."""
    once = key()
    written(await service.remember(user(), candidate("kept"), once))
    with pytest.raises(asyncpg.CheckViolationError, match="memories_root_is_not_a_tombstone"):
        await admin.execute(
            "INSERT INTO memories (organization_id, definition_id, scope, subject_key,"
            " forgotten_at) VALUES ($1, $2, 'organization', $3, now())",
            ORG_A,
            DEFINITION,
            f"organization:{ORG_A}:observation.sneak",
        )
    with pytest.raises(asyncpg.PostgresError, match="never changes"):
        await admin.execute(
            "UPDATE memory_writes SET outcome = 'refused', reason = 'duplicate'"
            " WHERE idempotency_key = $1",
            once,
        )


@pytest.mark.usefixtures("tenants")
async def test_the_owner_cannot_truncate_the_memory_tables(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    written(await service.remember(user(), candidate("kept"), key()))
    owner = await asyncpg.connect(database.owner_url)
    try:
        for statement in (
            "TRUNCATE memories CASCADE",
            "TRUNCATE memory_writes",
            "TRUNCATE organizations CASCADE",
        ):
            with pytest.raises(asyncpg.PostgresError, match="never truncated"), _named(statement):
                await owner.execute(statement)
    finally:
        await owner.close()
    assert await admin.fetchval("SELECT count(*) FROM memories") == 1
    assert await admin.fetchval("SELECT count(*) FROM memory_writes") == 1


# ------------------------------------------------------------------ many writes, one transaction


@pytest.mark.usefixtures("tenants")
async def test_a_batch_applies_writes_of_one_chain_in_order_and_replays_a_repeated_key(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    # concurrency 1: calls made together gather into one batch, one transaction
    service = MemoryService(PostgresMemoryJournal(tenant_db), max_batch=64, concurrency=1)
    repeated = key()
    answers = await asyncio.gather(
        service.remember(user(), candidate("another chain", "observation.other"), key()),
        service.remember(user(), candidate("English"), key()),
        service.remember(user(), candidate("German"), repeated),
        service.remember(user(), candidate("German"), repeated),
        service.remember(user(), candidate("German"), key()),
        service.remember(user(), candidate("English"), key()),
    )
    assert [written(a).change for a in answers[1:3]] == ["created", "superseded"]
    replay = written(answers[3])
    assert replay.replayed
    assert replay.memory == written(answers[2]).memory
    refused(answers[4], "duplicate")
    assert written(answers[5]).change == "superseded"
    rows = await chain(admin, ORG_A, "preference.language")
    parents = {row["supersedes_id"] for row in rows}
    assert len(rows) == 3
    assert len(parents) == 3
    assert await admin.fetchval("SELECT count(*) FROM memory_writes") == 6 - 1  # one replay
    # one transaction: every journal row carries its start time
    assert await admin.fetchval("SELECT count(DISTINCT created_at) FROM memory_writes") == 1


@pytest.mark.usefixtures("tenants")
async def test_a_write_the_database_refuses_costs_only_its_own_answer_in_a_batch(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    service = MemoryService(PostgresMemoryJournal(tenant_db), max_batch=64, concurrency=1)
    nowhere = user(uuid.uuid4())  # an organization that does not exist
    answers = await asyncio.gather(
        service.remember(user(), candidate("another chain", "observation.other"), key()),
        service.remember(user(), candidate("English"), key()),
        service.remember(nowhere, candidate("English"), key()),
        service.remember(user(ORG_B), candidate("Dutch"), key()),
        service.forget(user(ORG_B), uuid.uuid4(), key()),
    )
    assert written(answers[1]).change == "created"
    refused(answers[2], "invalid_input")
    assert written(answers[3]).memory.organization_id == ORG_B
    refused(answers[4], "not_live")
    assert await admin.fetchval("SELECT count(*) FROM memories") == 3
    # the batch rolled back whole, then each write went alone: four journaled answers, four
    # transactions (the refused organization has none)
    assert await admin.fetchval("SELECT count(DISTINCT created_at) FROM memory_writes") == 4


@pytest.mark.usefixtures("tenants")
async def test_a_batch_never_reaches_another_tenants_memory(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    service = MemoryService(PostgresMemoryJournal(tenant_db), max_batch=64, concurrency=1)
    a_memory = written(await service.remember(user(ORG_A), candidate("English"), key())).memory
    answers = await asyncio.gather(
        service.remember(user(ORG_A), candidate("another chain", "observation.other"), key()),
        service.forget(user(ORG_B), a_memory.id, key()),  # B names A's live memory
        service.remember(user(ORG_B), candidate("English"), key()),  # B's own chain, A's key
    )
    refused(answers[1], "not_live")
    b_memory = written(answers[2]).memory
    assert b_memory.organization_id == ORG_B
    assert b_memory.supersedes_id is None
    heads = await admin.fetch("SELECT organization_id, id FROM memory_heads")
    assert {(row["organization_id"], row["id"]) for row in heads} >= {
        (ORG_A, a_memory.id),
        (ORG_B, b_memory.id),
    }


@pytest.mark.usefixtures("tenants")
async def test_an_unscoped_transaction_sees_and_writes_no_memory(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, service: MemoryService
) -> None:
    written(await service.remember(user(), candidate("English"), key()))
    async with tenant_db.writing_each() as conn:
        assert await conn.fetchval("SELECT count(*) FROM memories") == 0
        assert await conn.fetchval("SELECT count(*) FROM memory_writes") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # RLS: no scope, no insert
            await conn.execute(
                "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
                " VALUES ($1, $2, 'organization',"
                " 'organization:' || $1::uuid::text || ':observation.x', 'x')",
                ORG_A,
                DEFINITION,
            )


@pytest.mark.usefixtures("tenants")
async def test_a_writer_of_the_same_key_that_commits_first_is_replayed_not_retried(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, service: MemoryService
) -> None:
    same = key()
    write = remember_write(user(), candidate("English"), same)
    async with tenant_db.writing_each() as conn:
        # the first writer has appended and journaled, and not committed yet
        (first,) = await store.apply(conn, [write])
        second = asyncio.create_task(service.remember(user(), candidate("English"), same))
        # it reads no journal row, appends a root, and waits on the first's uncommitted one
        for _ in range(500):  # up to 10 s
            if await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%memory_apply%'"
                " AND datname = current_database()"  # this test's: other tests run beside it
            ):
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the second writer never waited on the first")
        assert not second.done()
    # the first commits: the second's journal row conflicts (CC002), and its second try replays
    replay = written(await second)
    assert replay.replayed
    assert replay.memory == written(first).memory
    assert await admin.fetchval("SELECT count(*) FROM memories") == 1
    assert await admin.fetchval("SELECT count(*) FROM memory_writes") == 1


async def test_the_head_lookup_reads_one_chain_under_a_generic_plan(
    admin: asyncpg.Connection, database: Database
) -> None:
    """PL/pgSQL runs a statement under a cached generic plan. Planned with an agent definition
    independent of its organization, the head lookup chose the index on (organization,
    definition) and read every revision of the definition for each write (migration 00013)."""
    # a young deployment's shape: 50 organizations, one definition each, 40 chains each
    orgs = [uuid.uuid4() for _ in range(50)]
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, 'o')", [(org,) for org in orgs]
    )
    await admin.execute(
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text)"
        " SELECT org, org, 'organization', 'organization:' || org || ':observation.f' || i, 'x'"
        " FROM unnest($1::uuid[]) AS org, generate_series(1, 40) AS i",
        orgs,
    )
    await admin.execute("ANALYZE memories")
    plans: list[str] = []
    conn = await asyncpg.connect(database.admin_url)
    try:
        conn.add_log_listener(lambda _conn, message: plans.append(message.message))
        await conn.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
            " SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice;"
            " SET plan_cache_mode = force_generic_plan"
        )
        invoker = Invoker(organization_id=orgs[0], definition_id=orgs[0], user_id=USER)
        write = remember_write(
            invoker,
            MemoryCandidate(scope="organization", attribute="observation.f1", text="y"),
            key(),
        )
        async with conn.transaction():
            await conn.execute("SELECT set_config('role', 'contextcore_app', true)")
            (answer,) = await store.apply(conn, [write])
    finally:
        await conn.close()
    assert written(answer).change == "superseded"
    (head_lookup,) = [plan for plan in plans if "FROM memory_heads" in plan]
    assert "memories_chain_identity" in head_lookup, head_lookup
    assert "memories_recent_by_definition" not in head_lookup, head_lookup
