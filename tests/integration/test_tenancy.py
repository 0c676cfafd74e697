"""The tenancy layer and row-level security on a real PostgreSQL."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from contextcore.storage.pool import create_pool
from contextcore.storage.provision import Login
from contextcore.storage.tenancy import (
    PLATFORM,
    SERVICE_ROLE,
    Connection,
    ScopedRead,
    TenantDatabase,
    TenantQuery,
)
from schemas.errors import ConfigurationError
from tests.integration import seed
from tests.services import Database, Roles

pytestmark = pytest.mark.integration


async def test_a_query_that_forgets_its_organization_filter_sees_one_tenant_only(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    a, b = await seed.organization(admin, "A"), await seed.organization(admin, "B")
    for org in (a, a, b, b, b):
        await seed.company(admin, org)
    await seed.insert(admin, "runs", organization_id=b, id=seed.new_id(), status="completed")
    async with tenant_db.scoped(a) as tenant:
        conn = tenant._conn  # the raw connection: no $1 discipline, only RLS stands
        companies = await conn.fetch("SELECT organization_id FROM crm_companies")
        organizations = await conn.fetch("SELECT id FROM organizations")
        runs = await conn.fetch("SELECT id FROM runs")
    assert [row["organization_id"] for row in companies] == [a, a]
    assert [row["id"] for row in organizations] == [a]
    assert runs == []


async def test_without_an_organization_setting_the_service_role_sees_nothing(
    admin: asyncpg.Connection,
) -> None:
    org = await seed.organization(admin)
    await seed.company(admin, org)
    async with admin.transaction():
        await admin.execute(f"SET LOCAL ROLE {SERVICE_ROLE}")
        assert await admin.fetchval("SELECT count(*) FROM crm_companies") == 0
        assert await admin.fetchval("SELECT count(*) FROM organizations") == 0


async def test_the_service_role_owns_no_table_and_cannot_bypass_rls(
    admin: asyncpg.Connection,
) -> None:
    owned = await admin.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tableowner = $1",
        SERVICE_ROLE,
    )
    role = await admin.fetchrow(
        "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", SERVICE_ROLE
    )
    assert owned == []
    assert role is not None
    assert (role["rolsuper"], role["rolbypassrls"]) == (False, False)
    unprotected = await admin.fetch("""
        SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
          AND a.attname = 'organization_id' AND NOT c.relrowsecurity
    """)
    assert unprotected == []  # every organization-scoped table has row-level security


async def test_tenant_reads_are_read_only(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org = await seed.organization(admin)
    async with tenant_db.scoped(org) as tenant:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await tenant._conn.execute("CREATE TEMP TABLE nope (x int)")


async def test_shared_intel_rows_are_readable_only_through_this_tenants_bridges(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    mine, theirs = seed.new_id(), seed.new_id()
    for intel in (mine, theirs):
        await seed.insert(admin, "intel_companies", id=intel, name="X", domain=f"{intel}.test")
    await seed.insert(
        admin, "prospects", organization_id=org, id=seed.new_id(), intel_company_id=mine
    )
    await seed.insert(
        admin, "prospects", organization_id=other, id=seed.new_id(), intel_company_id=theirs
    )
    async with tenant_db.scoped(org) as tenant:
        visible = await tenant._conn.fetch("SELECT id FROM tenant_intel_companies")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await tenant._conn.fetch("SELECT id FROM intel_companies")
    assert [row["id"] for row in visible] == [mine]


def test_a_tenant_query_must_filter_by_the_organization_parameter() -> None:
    with pytest.raises(ValueError, match=r"does not filter by \$1"):
        TenantQuery("oops", "SELECT * FROM crm_companies WHERE id = $2")
    with pytest.raises(ValueError, match=r"does not filter by \$1"):
        TenantQuery("oops", "SELECT * FROM crm_companies WHERE id = $10")
    TenantQuery("ok", "SELECT * FROM crm_companies WHERE organization_id = $1")


# ------------------------------------------------------ scoped reads in one statement (00029)

RUNS = ScopedRead("runs", "SELECT id FROM contextcore_read_runs($1, 24, $2, NULL, '{}', NULL, 50)")


async def test_a_scoped_read_that_forgets_its_filter_sees_one_tenant_only(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """The read function's own filter removed (in this test's database only), row security
    still keeps the read in the organization its statement named."""
    a, b = await seed.organization(admin, "A"), await seed.organization(admin, "B")
    user = seed.new_id()
    for org, count in ((a, 2), (b, 3)):
        for _ in range(count):
            await seed.insert(
                admin,
                "runs",
                organization_id=org,
                id=seed.new_id(),
                status="completed",
                user_id=user,
            )
    assert len(await tenant_db.read(RUNS, a, user)) == 2
    await admin.execute("""
        CREATE OR REPLACE FUNCTION contextcore_read_runs(
            organization uuid, lookback_hours integer, asker uuid, asking_trigger uuid,
            patterns jsonb[], current_run uuid, max_runs integer
        ) RETURNS TABLE (
            id uuid, parent_run_id uuid, status text, result_summary text, result_refs jsonb,
            waiting_reason text, failure_reason text, created_at timestamptz
        ) LANGUAGE sql VOLATILE SET search_path = pg_catalog, public AS $$
            SELECT contextcore_enter_read(organization);
            SELECT id, parent_run_id, status, result_summary, result_refs, waiting_reason,
                   failure_reason, created_at FROM runs  -- no filter at all
        $$""")
    assert len(await tenant_db.read(RUNS, a, user)) == 2
    assert len(await tenant_db.read(RUNS, b, user)) == 3


async def test_a_scoped_read_ends_its_scope_with_its_statement(
    admin: asyncpg.Connection, database: Database
) -> None:
    org = await seed.organization(admin)
    user = seed.new_id()
    await seed.insert(
        admin, "runs", organization_id=org, id=seed.new_id(), status="completed", user_id=user
    )
    pool = await create_pool(database.url, min_size=1, max_size=1, session_role=SERVICE_ROLE)
    try:
        tenants = TenantDatabase(pool)
        assert len(await tenants.read(RUNS, org, user)) == 1
        async with pool.acquire() as conn:  # the same, only connection, back in the pool
            assert await conn.fetchval("SELECT current_user") == SERVICE_ROLE
            assert await conn.fetchval("SELECT contextcore_current_organization()") is None
            assert await conn.fetchval("SELECT count(*) FROM runs") == 0
            assert not conn.is_in_transaction()
    finally:
        await pool.close()


async def test_the_login_itself_cannot_run_a_scoped_read(
    admin: asyncpg.Connection, database: Database
) -> None:
    """The read functions are the service role's: a pool of the bare login gets a
    configuration error that says how to open the pool, and no row."""
    org = await seed.organization(admin)
    pool = await asyncpg.create_pool(database.url, min_size=1, max_size=1)
    try:
        with pytest.raises(ConfigurationError, match="session_role"):
            await TenantDatabase(pool).read(RUNS, org, seed.new_id())
        async with pool.acquire() as conn:  # no USAGE on the schema: not even seen
            with pytest.raises(asyncpg.UndefinedFunctionError):
                await conn.fetch("SELECT contextcore_enter_read($1::uuid)", org)
    finally:
        await pool.close()


def test_a_scoped_read_must_call_a_read_function_with_the_organization_first() -> None:
    with pytest.raises(ValueError, match="contextcore_read_"):
        ScopedRead("oops", "SELECT * FROM crm_companies WHERE organization_id = $1")
    with pytest.raises(ValueError, match="contextcore_read_"):
        ScopedRead("oops", "SELECT * FROM contextcore_read_runs($2, $1)")
    ScopedRead("ok", "SELECT * FROM contextcore_read_runs($1, $2)")


# ------------------------------------------------------------ the runtime login (issue 7, #3)


async def attempt(conn: Connection, *statements: str) -> object:
    """Run ``statements`` in a savepoint that is rolled back whatever happens (a refusal, or a
    RESET ROLE, leaves the scope as it was); the last statement's first value."""
    await conn.execute("SAVEPOINT attempt")
    try:
        for statement in statements[:-1]:
            await conn.execute(statement)
        return await conn.fetchval(statements[-1])
    finally:
        await conn.execute("ROLLBACK TO SAVEPOINT attempt")


async def test_the_runtime_login_leaving_the_tenant_role_can_read_nothing(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, roles: Roles
) -> None:
    """RESET ROLE inside a scope leaves the login itself, which holds no privilege at all."""
    mine, theirs = await seed.organization(admin), await seed.organization(admin)
    await seed.company(admin, theirs)
    async with tenant_db.scoped(mine) as tenant:
        conn = tenant._conn
        assert await attempt(conn, "RESET ROLE", "SELECT current_user") == roles.runtime.user
        for table in ("crm_companies", "organizations", "processed_messages", "intel_people"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attempt(conn, "RESET ROLE", f"SELECT * FROM public.{table}")


async def test_the_runtime_login_cannot_run_programs_or_become_the_owner(
    database: Database, tenant_db: TenantDatabase
) -> None:
    org = uuid.uuid4()
    owner = Login.of(database.owner_url).user
    async with tenant_db.writing(org) as tenant:
        conn = tenant._conn
        for statements in (
            ["COPY (SELECT 1) TO PROGRAM 'true'"],
            [f'SET ROLE "{owner}"'],
            ["RESET ROLE", "COPY (SELECT 1) TO PROGRAM 'true'"],
            ["RESET ROLE", f'SET ROLE "{owner}"'],
            ["CREATE TEMP TABLE scratch (x int)"],
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attempt(conn, *statements)


async def test_no_tenant_scope_may_add_a_model_to_the_global_catalog(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Issue 17, item 5: knowledge_models belongs to no tenant (no organization, no row
    security); the service role may read it, never write it (migration 00015)."""
    org = await seed.organization(admin)
    for scope in (org, PLATFORM):
        async with tenant_db.writing(scope) as tenant:
            conn = tenant._conn
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await attempt(
                    conn,
                    "INSERT INTO knowledge_models (name, dimensions) VALUES ('evil/model', 3)"
                    " RETURNING name",
                )
            assert await attempt(conn, "SELECT count(*) FROM knowledge_models") == 1
    assert await admin.fetchval("SELECT count(*) FROM knowledge_models") == 1


async def test_the_runtime_login_owns_nothing_and_holds_only_the_service_role(
    admin: asyncpg.Connection, database: Database
) -> None:
    runtime = Login.of(database.url).user
    login = await admin.fetchrow(
        "SELECT rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolbypassrls "
        "FROM pg_roles WHERE rolname = $1",
        runtime,
    )
    assert login is not None
    assert tuple(login) == (False, False, False, False, False)
    memberships = await admin.fetch(
        "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
        "WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = $1)",
        runtime,
    )
    assert [row["rolname"] for row in memberships] == [SERVICE_ROLE]
    owned = await admin.fetchval(
        "SELECT count(*) FROM pg_class WHERE relowner = (SELECT oid FROM pg_roles "
        "WHERE rolname = $1)",
        runtime,
    )
    assert owned == 0


async def test_row_level_security_is_forced_on_every_tenant_table(
    admin: asyncpg.Connection,
) -> None:
    """FORCE: the owner's views and functions are held to the current organization too. The
    ledger is the one exception (docs/tenancy.md): message ids, no tenant content."""
    unforced = await admin.fetch("""
        SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
          AND a.attname = 'organization_id' AND NOT c.relforcerowsecurity
    """)
    assert [row["relname"] for row in unforced] == ["processed_messages"]
    organizations = await admin.fetchrow(
        "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE relname = 'organizations'"
    )
    assert organizations is not None
    assert tuple(organizations) == (True, True)


async def test_the_owner_reads_no_tenant_row_outside_a_scope(
    admin: asyncpg.Connection, database: Database
) -> None:
    """A service wrongly started with the owner's credential still reads no tenant's rows."""
    org = await seed.organization(admin)
    await seed.company(admin, org)
    owner = await asyncpg.connect(database.owner_url)
    try:
        assert await owner.fetchval("SELECT count(*) FROM crm_companies") == 0
        assert await owner.fetchval("SELECT count(*) FROM organizations") == 0
    finally:
        await owner.close()
