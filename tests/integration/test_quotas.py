"""Quotas per organization (issue 33, target 6; migration 00038, contextcore/quotas.py), on the
real broker and PostgreSQL: each refusal names its quota, stores nothing, and touches no other
organization; the table is the operator's, and no tenant reads another's row."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from admin.quotas import clear_quotas, quotas_in_force, set_quotas
from broker.topics import ensure_topics, memory_topics
from contextcore.memory.adapters.erasure import erase
from contextcore.memory.adapters.store import PostgresMemoryJournal, apply
from contextcore.memory.service import MemoryService, Write, remember_write
from contextcore.quotas import Quotas
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from producers.memory import MemoryClient
from schemas.memory import Invoker, MemoryCandidate, Refusal, Written
from tests.integration.test_knowledge_admin import start_pipeline, upload_all
from tests.integration.test_knowledge_pipeline import HANDBOOK, ORG_A, ORG_B
from tests.services import Config, Database, StartConsumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),  # an embedding consumer loads its model first: slow on a busy machine
]

FAQ = "# FAQ\n\n## Invoices\n\nInvoices are sent by email on the first working day of each month.\n"
NOTE = "# Note\n\nThe office is closed on public holidays.\n"


@pytest.fixture
async def owner(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """The schema owner: the one who sets quotas (`contextcore quota`)."""
    conn = await asyncpg.connect(database.owner_url)
    yield conn
    await conn.close()


@pytest.fixture
async def organizations(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )


async def chunks_of(admin: asyncpg.Connection, organization: uuid.UUID) -> int:
    count: int = await admin.fetchval(
        "SELECT count(*) FROM knowledge_chunks WHERE organization_id = $1", organization
    )
    return count


@pytest.mark.usefixtures("organizations")
async def test_upload_quotas_refuse_with_the_quota_named_and_store_nothing(
    config: Config,
    start_consumer: StartConsumer,
    owner: asyncpg.Connection,
    admin: asyncpg.Connection,
) -> None:
    await start_pipeline(config, start_consumer)

    # chunks_per_document: A's three-chunk handbook fails before a chunk is stored; B, with no
    # quota, stores the same document
    await set_quotas(owner, ORG_A, chunks_per_document=2)
    ours, theirs = await upload_all(
        config,
        (ORG_A, "docs://handbook", HANDBOOK),
        (ORG_B, "docs://handbook", HANDBOOK),
        failed_too=True,
    )
    assert ours.status == "failed"
    assert "chunks_per_document" in (ours.reason or ""), ours
    assert await chunks_of(admin, ORG_A) == 0
    assert (theirs.status, await chunks_of(admin, ORG_B)) == ("ready", 3)

    # stored_chunks: 1 + 3 chunks fit a quota of 4; one more chunk does not, and fails whole
    await set_quotas(owner, ORG_A, chunks_per_document=None, stored_chunks=4)
    faq, handbook, note = await upload_all(
        config,
        (ORG_A, "docs://faq", FAQ),
        (ORG_A, "docs://handbook", HANDBOOK),
        (ORG_A, "docs://note", NOTE),
        failed_too=True,
    )
    assert (faq.status, handbook.status) == ("ready", "ready"), (faq, handbook)
    assert note.status == "failed"
    assert "stored_chunks" in (note.reason or ""), note
    assert await chunks_of(admin, ORG_A) == 4

    # uploads_in_flight: with one of A's uploads pending, the next is rejected at once, and
    # neither a source nor a ledger claim is left of it
    await set_quotas(owner, ORG_A, uploads_in_flight=1)
    await admin.execute(
        """INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,
                                          status, pending_since, upload_key)
           VALUES ($1, $2, 'inline', 'Slow', 'docs://slow', 'text/markdown', 'pending', now(),
                   'slow-upload')""",
        uuid.uuid4(),
        ORG_A,
    )
    [rejected] = await upload_all(config, (ORG_A, "docs://later", NOTE), failed_too=True)
    assert rejected.status == "rejected"
    assert "uploads_in_flight" in (rejected.reason or ""), rejected
    assert not await admin.fetchval(
        "SELECT count(*) FROM knowledge_sources WHERE uri = 'docs://later'"
    )
    [b_note] = await upload_all(config, (ORG_B, "docs://note", NOTE), failed_too=True)
    assert b_note.status == "ready"


MEMORY_ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000c1")
OTHER_ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000c2")
DEFINITION = uuid.UUID("7b000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7b000000-0000-4000-8000-00000000e001")


async def test_memory_revisions_past_the_quota_are_refused_unjournaled_and_forget_still_works(
    config: Config,
    start_consumer: StartConsumer,
    owner: asyncpg.Connection,
    admin: asyncpg.Connection,
) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)",
        [(MEMORY_ORG, "M"), (OTHER_ORG, "N")],
    )
    await ensure_topics(config.bootstrap, memory_topics(config.topics))
    await set_quotas(owner, MEMORY_ORG, memory_revisions=2)
    await start_consumer(config, consumer="memory")
    ours = Invoker(organization_id=MEMORY_ORG, definition_id=DEFINITION, user_id=USER)
    theirs = Invoker(organization_id=OTHER_ORG, definition_id=DEFINITION, user_id=USER)

    def fact(i: int) -> MemoryCandidate:
        return MemoryCandidate(scope="user", attribute=f"preference.n{i}", text=f"fact {i}")

    async with MemoryClient(
        bootstrap_servers=config.bootstrap,
        memory_topic=config.topics.memory_write,
        reply_topic_prefix=config.topics.reply_prefix,
        fetch_max_wait_ms=config.kafka.fetch_max_wait_ms,
    ) as memory:
        first = await memory.remember(ours, fact(1))
        second = await memory.remember(ours, fact(2))
        assert (first.status, second.status) == ("written", "written")
        third = await memory.remember(ours, fact(3), idempotency_key="third")
        assert (third.status, third.reason) == ("refused", "quota")
        assert "memory_revisions" in (third.message or "")
        # another organization, in the same topic, is not held to it
        assert [(await memory.remember(theirs, fact(i))).status for i in range(3)] == [
            "written"
        ] * 3
        # a forget is always taken (it appends a tombstone: the chain ends, no room is freed)
        assert first.memory is not None
        forgotten = await memory.forget(ours, first.memory.id)
        assert (forgotten.status, forgotten.change) == ("written", "forgotten")
        # the refusal was not journaled: under a raised quota the same call is applied
        await set_quotas(owner, MEMORY_ORG, memory_revisions=10)
        again = await memory.remember(ours, fact(3), idempotency_key="third")
        assert (again.status, again.change) == ("written", "created")
    held = await admin.fetchval(
        "SELECT count(*) FROM memories WHERE organization_id = $1", MEMORY_ORG
    )
    assert held == 4  # two facts, a tombstone, the third fact


async def test_concurrent_batches_of_one_organization_never_pass_its_memory_revisions(
    owner: asyncpg.Connection, admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Two memory services (two consumer processes) write ten memories of one organization at
    once, in batches: exactly the quota is written, the rest refused ``quota``. An erasure (the
    operator's) frees the room its revisions took; a forget does not (it is a revision too)."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'M')", MEMORY_ORG)
    await set_quotas(owner, MEMORY_ORG, memory_revisions=4)
    services = [MemoryService(PostgresMemoryJournal(tenant_db), concurrency=2) for _ in range(2)]
    ours = Invoker(organization_id=MEMORY_ORG, definition_id=DEFINITION, user_id=USER)

    def fact(i: int) -> MemoryCandidate:
        return MemoryCandidate(scope="user", attribute=f"preference.c{i}", text=f"fact {i}")

    answers = await asyncio.gather(
        *(services[i % 2].remember(ours, fact(i), f"key-{i}") for i in range(10))
    )
    written = [a for a in answers if isinstance(a, Written)]
    refused = [a.reason for a in answers if isinstance(a, Refusal)]
    assert (len(written), refused) == (4, ["quota"] * 6)
    forgotten = await services[0].forget(ours, written[0].memory.id, "forget-0")
    assert isinstance(forgotten, Written)  # taken, and it fills no room: still at the quota
    assert isinstance(await services[0].remember(ours, fact(20), "key-20"), Refusal)
    # erasing the forgotten chain (its revision and its tombstone) frees two: room for one
    done = await erase(owner, MEMORY_ORG, "memory", str(written[0].memory.id), apply=True)
    assert done.revisions == 2
    again = await services[0].remember(ours, fact(20), "key-20")
    assert isinstance(again, Written), again


async def test_a_second_batch_of_the_organization_counts_after_the_first_commits(
    owner: asyncpg.Connection, admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Two transactions of one organization's writes, the first still open: the second waits
    for it, then counts its revisions, so the two never fill the same room (without the lock
    each counted none and both wrote three, six of a quota of four)."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'M')", MEMORY_ORG)
    await set_quotas(owner, MEMORY_ORG, memory_revisions=4)
    ours = Invoker(organization_id=MEMORY_ORG, definition_id=DEFINITION, user_id=USER)

    def writes(batch: str) -> list[Write]:
        return [
            remember_write(
                ours,
                MemoryCandidate(scope="user", attribute=f"preference.{batch}{i}", text=batch),
                f"{batch}-{i}",
            )
            for i in range(3)
        ]

    async def second() -> list[object]:
        async with tenant_db.writing_each() as conn:
            return list(await apply(conn, writes("second")))

    async with tenant_db.writing_each() as conn:
        first = await apply(conn, writes("first"))
        waiting = asyncio.create_task(second())
        await asyncio.sleep(0.5)
        assert not waiting.done()  # it waits for the first batch's lock
    answers = [*first, *await waiting]
    assert sum(isinstance(a, Written) for a in answers) == 4
    assert [a.reason for a in answers if isinstance(a, Refusal)] == ["quota", "quota"]


async def test_a_tenant_reads_its_own_quotas_and_the_default_and_writes_none(
    owner: asyncpg.Connection, admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )
    await set_quotas(owner, ORG_A, build_rate=5.0, memory_revisions=100)
    await set_quotas(owner, ORG_B, build_rate=50.0, stored_chunks=7)
    await set_quotas(owner, None, uploads_in_flight=3, build_rate=1.0)
    assert await quotas_in_force(owner, ORG_A) == Quotas(
        build_rate=5.0, uploads_in_flight=3, memory_revisions=100
    )
    assert await quotas_in_force(owner, uuid.uuid4()) == Quotas(build_rate=1.0, uploads_in_flight=3)
    async with tenant_db.writing(ORG_A) as tenant:
        conn = tenant._conn  # the raw connection: only RLS stands
        rows = await conn.fetch("SELECT organization_id FROM organization_quotas")
        assert sorted(str(r["organization_id"]) for r in rows) == sorted(["None", str(ORG_A)])
        # another organization's quotas, asked for by id in A's scope: the default only
        b = await conn.fetchrow("SELECT * FROM contextcore_quotas($1)", ORG_B)
        assert b is not None
        assert (b["build_rate"], b["stored_chunks"]) == (1.0, None)
        for statement in (
            "UPDATE organization_quotas SET build_rate = 1000",
            f"INSERT INTO organization_quotas (organization_id, build_rate) "
            f"VALUES ('{ORG_A}', 1000)",
            "DELETE FROM organization_quotas",
        ):
            await conn.execute("SAVEPOINT attempt")  # the scope's transaction goes on
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
            await conn.execute("ROLLBACK TO SAVEPOINT attempt")
    assert await admin.fetchval(
        "SELECT tableowner <> $1 FROM pg_tables WHERE tablename = 'organization_quotas'",
        SERVICE_ROLE,
    )
    await clear_quotas(owner, ORG_A)
    assert (await quotas_in_force(owner, ORG_A)).build_rate == 1.0


async def test_the_quota_command_sets_shows_and_clears(
    config: Config, database: Database, admin: asyncpg.Connection
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)

    async def quota(*args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "producers.command",
            "quota",
            *args,
            env={**config.environ(), "CONTEXTCORE_DATABASE_OWNER_URL": database.owner_url},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 120)
        return await process.wait(), out.decode()

    code, out = await quota("set", "--organization", str(ORG_A), "--build-rate", "20")
    assert code == 0, out
    assert "build_rate: 20" in out
    assert "uploads_in_flight: no limit" in out
    code, out = await quota("set", "--default", "--uploads-in-flight", "5")
    assert (code, "uploads_in_flight: 5" in out) == (0, True), out
    code, out = await quota("show", "--organization", str(ORG_A))
    assert "build_rate: 20" in out, out
    assert "uploads_in_flight: 5" in out, out
    code, out = await quota("set", "--organization", str(ORG_A), "--build-rate", "-1")
    assert code == 2, out  # the command line's mistake
    code, out = await quota("clear", "--organization", str(ORG_A))
    assert (code, "build_rate: no limit" in out) == (0, True), out
