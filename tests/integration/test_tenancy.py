"""The tenancy layer and row-level security on a real PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest

from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase, TenantQuery
from tests.integration import seed

pytestmark = pytest.mark.integration


async def test_a_query_that_forgets_its_organization_filter_sees_one_tenant_only(
    owner: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    a, b = await seed.organization(owner, "A"), await seed.organization(owner, "B")
    for org in (a, a, b, b, b):
        await seed.company(owner, org)
    await seed.insert(owner, "runs", organization_id=b, id=seed.new_id(), status="completed")
    async with tenant_db.scoped(a) as tenant:
        conn = tenant._conn  # the raw connection: no $1 discipline, only RLS stands
        companies = await conn.fetch("SELECT organization_id FROM crm_companies")
        organizations = await conn.fetch("SELECT id FROM organizations")
        runs = await conn.fetch("SELECT id FROM runs")
    assert [row["organization_id"] for row in companies] == [a, a]
    assert [row["id"] for row in organizations] == [a]
    assert runs == []


async def test_without_an_organization_setting_the_service_role_sees_nothing(
    owner: asyncpg.Connection,
) -> None:
    org = await seed.organization(owner)
    await seed.company(owner, org)
    async with owner.transaction():
        await owner.execute(f"SET LOCAL ROLE {SERVICE_ROLE}")
        assert await owner.fetchval("SELECT count(*) FROM crm_companies") == 0
        assert await owner.fetchval("SELECT count(*) FROM organizations") == 0


async def test_the_service_role_owns_no_table_and_cannot_bypass_rls(
    owner: asyncpg.Connection,
) -> None:
    owned = await owner.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tableowner = $1",
        SERVICE_ROLE,
    )
    role = await owner.fetchrow(
        "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", SERVICE_ROLE
    )
    assert owned == []
    assert role is not None
    assert (role["rolsuper"], role["rolbypassrls"]) == (False, False)
    unprotected = await owner.fetch("""
        SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
          AND a.attname = 'organization_id' AND NOT c.relrowsecurity
          AND c.relname <> 'processed_messages'
    """)
    assert unprotected == []  # every organization-scoped table has row-level security


async def test_tenant_reads_are_read_only(
    owner: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org = await seed.organization(owner)
    async with tenant_db.scoped(org) as tenant:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await tenant._conn.execute("CREATE TEMP TABLE nope (x int)")


async def test_shared_intel_rows_are_readable_only_through_this_tenants_bridges(
    owner: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org, other = await seed.organization(owner), await seed.organization(owner)
    mine, theirs = seed.new_id(), seed.new_id()
    for intel in (mine, theirs):
        await seed.insert(owner, "intel_companies", id=intel, name="X", domain=f"{intel}.test")
    await seed.insert(
        owner, "prospects", organization_id=org, id=seed.new_id(), intel_company_id=mine
    )
    await seed.insert(
        owner, "prospects", organization_id=other, id=seed.new_id(), intel_company_id=theirs
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
