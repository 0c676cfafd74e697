"""The processed-message ledger: one claim per scope, in the effect's transaction (issue 7, #4)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import pytest

from contextcore.storage import ledger
from contextcore.storage.tenancy import PLATFORM, TenantDatabase, TenantQuery

pytestmark = pytest.mark.integration

# An effect a write consumer could apply: here, a marker row in a scratch table of the test.
MARK = TenantQuery(
    "test.mark",
    "INSERT INTO ledger_effects (organization_id, message_id) VALUES ($1, $2)",
)


@pytest.fixture
async def effects(admin: asyncpg.Connection) -> None:
    await admin.execute(
        "CREATE TABLE ledger_effects (organization_id uuid, message_id text);"
        "GRANT INSERT ON ledger_effects TO contextcore_app"
    )


async def test_two_tenants_may_use_one_idempotency_key(tenant_db: TenantDatabase) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    for scope in (a, b, PLATFORM):
        async with tenant_db.writing(scope) as tenant:
            assert await ledger.claim(tenant, "memory", "key-1") is True
    for scope in (a, b, PLATFORM):
        async with tenant_db.writing(scope) as tenant:
            assert await ledger.claim(tenant, "memory", "key-1") is False  # a redelivery
            assert await ledger.claim(tenant, "upload", "key-1") is True  # per consumer


async def test_a_claim_commits_or_rolls_back_with_its_effect(
    tenant_db: TenantDatabase, admin: asyncpg.Connection, effects: None
) -> None:
    org = uuid.uuid4()

    class Crash(Exception):
        pass

    async def crash_before_commit() -> None:
        async with tenant_db.writing(org) as tenant:
            assert await ledger.claim(tenant, "memory", "m-1")
            await tenant.execute(MARK, "m-1")
            raise Crash  # the worker dies between the effect and the commit

    with pytest.raises(Crash):
        await crash_before_commit()
    async with tenant_db.writing(org) as tenant:  # the redelivery applies it, once
        assert await ledger.claim(tenant, "memory", "m-1") is True
        await tenant.execute(MARK, "m-1")
    async with tenant_db.writing(org) as tenant:
        assert await ledger.claim(tenant, "memory", "m-1") is False
    assert await admin.fetchval("SELECT count(*) FROM ledger_effects") == 1


async def test_a_scope_can_neither_see_nor_write_another_tenants_claims(
    tenant_db: TenantDatabase,
) -> None:
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    async with tenant_db.writing(theirs) as tenant:
        await ledger.claim(tenant, "memory", "secret-key")
    async with tenant_db.writing(mine) as tenant:
        conn = tenant._conn  # raw SQL: only RLS stands
        assert await conn.fetch("SELECT * FROM processed_messages") == []
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # RLS WITH CHECK
            await conn.execute(
                "INSERT INTO processed_messages (organization_id, consumer, message_id) "
                "VALUES ($1, 'memory', 'forged')",
                theirs,
            )
    async with tenant_db.writing(mine) as tenant:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # the platform is not a tenant
            await tenant._conn.execute(
                "INSERT INTO processed_messages (organization_id, consumer, message_id) "
                "VALUES (NULL, 'memory', 'forged')"
            )
    async with tenant_db.writing(mine) as tenant:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # no update, no delete
            await tenant._conn.execute("DELETE FROM processed_messages")


async def test_prune_forgets_expired_claims_of_every_tenant_and_refuses_a_bad_batch(
    tenant_db: TenantDatabase, admin: asyncpg.Connection, database_url: str
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    for scope in (a, b):
        async with tenant_db.writing(scope) as tenant:
            await ledger.claim(tenant, "memory", "old")
            await ledger.claim(tenant, "memory", "new")
    await admin.execute(
        "UPDATE processed_messages SET processed_at = now() - interval '8 days' "
        "WHERE message_id = 'old'"
    )
    runtime = await asyncpg.connect(database_url)
    try:
        for batch in (0, -1):
            with pytest.raises(ValueError, match="positive"):
                await ledger.prune(runtime, older_than=timedelta(days=7), batch=batch)
        async with runtime.transaction():  # the database refuses it too
            await runtime.execute("SET LOCAL ROLE contextcore_app")
            with pytest.raises(asyncpg.InvalidParameterValueError, match="must be positive"):
                await runtime.fetchval("SELECT contextcore_prune_processed_messages('7 days', 0)")
        # whatever retention the caller asks for, claims younger than a day stay (00006): a
        # microsecond prunes the two 8-day-old claims, a bounded batch at a time, not the new
        tiny = timedelta(microseconds=1)
        assert await ledger.prune(runtime, older_than=tiny, batch=1) == 1
        assert await ledger.prune(runtime, older_than=tiny) == 1
        assert await ledger.prune(runtime, older_than=tiny) == 0
    finally:
        await runtime.close()
    left = await admin.fetch("SELECT message_id FROM processed_messages ORDER BY 1")
    assert [row["message_id"] for row in left] == ["new", "new"]
    async with tenant_db.writing(a) as tenant:  # forgotten, so claimable again
        assert await ledger.claim(tenant, "memory", "old") is True
