"""The application source on a real PostgreSQL: explicit refs only, one query per kind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextcore.refs import PROJECTIONS
from contextcore.sources.application import ApplicationContextSource
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from schemas.context import ContextRequest, ContextSourceSpec, ContextSubject, ResourceRef
from tests.integration import seed

pytestmark = pytest.mark.integration


class QueryLog:
    def __init__(self) -> None:
        self.queries: list[str] = []

    def __call__(self, record: Any) -> None:
        self.queries.append(record.query)

    def reads(self) -> list[str]:
        """Source reads only: not the SET ROLE / set_config of each scope."""
        return [q for q in self.queries if q.lstrip().startswith("-- application.")]


@pytest.fixture
async def logged() -> QueryLog:
    return QueryLog()


@pytest.fixture
async def source(database_url: str, logged: QueryLog) -> AsyncIterator[ApplicationContextSource]:
    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(logged)
        await conn.execute("SELECT set_config('role', $1, false)", SERVICE_ROLE)

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2, init=init)
    assert pool is not None
    yield ApplicationContextSource(TenantDatabase(pool))
    await pool.close()


def request(org: uuid.UUID, *refs: ResourceRef) -> ContextRequest:
    return ContextRequest(
        subject=ContextSubject(
            organization_id=org, user_id=None, trigger_id=None, definition_id=None
        ),
        query="ignored",
        entities=refs,
    )


def spec(limit: int | None = None) -> ContextSourceSpec:
    return ContextSourceSpec(name="application", token_budget=1000, limit=limit)


def ref(kind: str, row_id: uuid.UUID | str, label: str | None = None) -> ResourceRef:
    return ResourceRef(kind=kind, id=str(row_id), label=label)


async def test_explicit_distinct_supported_refs_only_in_request_order(
    admin: asyncpg.Connection, source: ApplicationContextSource
) -> None:
    org = await seed.organization(admin)
    acme = await seed.company(admin, org, name="Acme", lifecycle_stage="customer")
    globex = await seed.company(admin, org, name="Globex", domain="globex.test")
    deal = seed.new_id()
    await seed.insert(
        admin,
        "crm_deals",
        organization_id=org,
        id=deal,
        name="Renewal",
        stage="proposal",
        company_id=acme,
    )
    items = await source.retrieve(
        request(
            org,
            ref("crm.deal", deal),
            ref("crm.company", globex, "Globex first"),
            ref("crm.company", acme),
            ref("crm.company", globex, "Globex again"),  # same (kind, id): the first label stays
            ref("crm.unknown_kind", acme),
            ref("crm.company", "not-a-uuid"),
        ),
        spec(),
    )
    assert [(i.ref.kind if i.ref else None, i.title, i.body) for i in items] == [
        ("crm.deal", "name", "Renewal"),
        ("crm.deal", "stage", "proposal"),
        ("crm.deal", "company_id", str(acme)),
        ("crm.company", "name", "Globex"),
        ("crm.company", "domain", "globex.test"),
        ("crm.company", "name", "Acme"),
        ("crm.company", "lifecycle_stage", "customer"),
    ]
    assert {i.ref.label for i in items if i.ref and i.ref.id == str(globex)} == {"Globex first"}
    assert items[6].subject_key == f"crm.company:{acme}:lifecycle_stage"
    assert all(i.kind == "application" and i.source == "application" for i in items)


async def test_the_query_text_is_never_searched(
    admin: asyncpg.Connection, source: ApplicationContextSource, logged: QueryLog
) -> None:
    org = await seed.organization(admin)
    await seed.company(admin, org, name="Acme")
    r = ContextRequest(
        subject=ContextSubject(
            organization_id=org, user_id=None, trigger_id=None, definition_id=None
        ),
        query="Acme",
        entities=(),
    )
    assert await source.retrieve(r, spec()) == []
    assert logged.reads() == []


async def test_missing_deleted_and_cross_organization_refs_return_no_item(
    admin: asyncpg.Connection, source: ApplicationContextSource
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    deleted = await seed.company(admin, org, deleted_at=datetime.now(UTC))
    foreign = await seed.company(admin, other)
    foreign_deal = seed.new_id()
    await seed.insert(admin, "crm_deals", organization_id=other, id=foreign_deal, name="Theirs")
    items = await source.retrieve(
        request(
            org,
            ref("crm.company", deleted),
            ref("crm.company", foreign),
            ref("crm.deal", foreign_deal),
            ref("crm.person", seed.new_id()),
        ),
        spec(),
    )
    assert items == []


async def test_one_statement_for_every_kind_whatever_the_number_of_refs(
    admin: asyncpg.Connection, source: ApplicationContextSource, logged: QueryLog
) -> None:
    org = await seed.organization(admin)
    companies = [await seed.company(admin, org, name=f"C{i}") for i in range(150)]
    person = seed.new_id()
    await seed.insert(admin, "crm_people", organization_id=org, id=person, full_name="Ada")
    refs = [ref("crm.company", c) for c in companies] + [ref("crm.person", person)]
    refs += [ref(kind, seed.new_id()) for kind in PROJECTIONS if kind != "crm.company"]
    items = await source.retrieve(request(org, *refs), spec())
    assert len([i for i in items if i.title == "name"]) == 150
    assert [i.body for i in items if i.title == "full_name"] == ["Ada"]
    # CLARIFICATIONS 14: 150 companies and every other kind are one statement (an array of
    # ids per kind), which enters its scope itself: no BEGIN, no COMMIT
    assert [q.split(":", 1)[0] for q in logged.reads()] == ["-- application.read"]
    assert not [q for q in logged.queries if q.startswith(("BEGIN", "COMMIT"))]


async def test_the_item_cap_keeps_ref_then_projection_order_and_zero_reads_nothing(
    admin: asyncpg.Connection, source: ApplicationContextSource, logged: QueryLog
) -> None:
    org = await seed.organization(admin)
    a = await seed.company(admin, org, name="A", domain="a.test", industry="x")
    b = await seed.company(admin, org, name="B")
    r = request(org, ref("crm.company", b), ref("crm.company", a))
    capped = await source.retrieve(r, spec(limit=3))
    assert [(i.body) for i in capped] == ["B", "A", "a.test"]
    everything = await source.retrieve(r, spec(limit=None))
    assert [(i.body) for i in everything] == ["B", "A", "a.test", "x"]
    logged.queries.clear()
    assert await source.retrieve(r, spec(limit=0)) == []
    assert logged.queries == []  # not even a scope was opened


async def test_a_shared_company_resolves_only_through_this_tenants_prospect(
    admin: asyncpg.Connection, source: ApplicationContextSource
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    mine, theirs = seed.new_id(), seed.new_id()
    for intel, domain in ((mine, "mine.test"), (theirs, "theirs.test")):
        await seed.insert(
            admin, "intel_companies", id=intel, name=domain, domain=domain, industry="software"
        )
    await seed.insert(
        admin, "prospects", organization_id=org, id=seed.new_id(), intel_company_id=mine
    )
    await seed.insert(
        admin, "prospects", organization_id=org, id=seed.new_id(), intel_company_id=mine
    )  # two bridges, one projection
    await seed.insert(
        admin, "prospects", organization_id=other, id=seed.new_id(), intel_company_id=theirs
    )
    items = await source.retrieve(
        request(org, ref("intelligence.company", mine), ref("intelligence.company", theirs)), spec()
    )
    assert [(i.title, i.body) for i in items] == [
        ("name", "mine.test"),
        ("domain", "mine.test"),
        ("industry", "software"),
    ]
    assert "lifecycle_stage" not in PROJECTIONS["intelligence.company"]
    await admin.execute("DELETE FROM intel_companies WHERE id = $1", mine)  # cascades
    assert await source.retrieve(request(org, ref("intelligence.company", mine)), spec()) == []


async def test_a_shared_person_resolves_once_through_prospect_people(
    admin: asyncpg.Connection, source: ApplicationContextSource
) -> None:
    org = await seed.organization(admin)
    person = seed.new_id()
    await seed.insert(admin, "intel_people", id=person, full_name="Grace", current_title="CTO")
    for _ in range(2):  # watched at two companies: two bridge rows
        prospect = seed.new_id()
        await seed.insert(admin, "prospects", organization_id=org, id=prospect)
        await seed.insert(
            admin,
            "prospect_people",
            organization_id=org,
            id=seed.new_id(),
            prospect_id=prospect,
            intel_person_id=person,
        )
    named = seed.new_id()
    await seed.insert(
        admin,
        "prospect_people",
        organization_id=org,
        id=named,
        prospect_id=prospect,
        full_name="Name Only",
    )
    items = await source.retrieve(
        request(org, ref("intelligence.person", person), ref("intelligence.person", named)), spec()
    )
    assert [(i.title, i.body) for i in items] == [("full_name", "Grace"), ("current_title", "CTO")]


async def test_the_named_person_index_ignores_case_and_whitespace_runs(
    admin: asyncpg.Connection,
) -> None:
    org = await seed.organization(admin)
    prospect = seed.new_id()
    await seed.insert(admin, "prospects", organization_id=org, id=prospect)
    await seed.insert(
        admin,
        "prospect_people",
        organization_id=org,
        id=seed.new_id(),
        prospect_id=prospect,
        full_name="Ada  Lovelace",
    )
    with pytest.raises(asyncpg.UniqueViolationError, match="uq_prospect_people_prospect_named"):
        await seed.insert(
            admin,
            "prospect_people",
            organization_id=org,
            id=seed.new_id(),
            prospect_id=prospect,
            full_name=" ada lovelace\t",
        )


async def test_values_render_as_the_brief_rendered_them_in_python(
    admin: asyncpg.Connection,
) -> None:
    """The read function renders numbers, dates and timestamps in SQL; a brief shows them as
    before, when Python rendered asyncpg's values: ``isoformat()`` and ``format(d, "f")``."""
    moments = st.datetimes(
        min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    )
    amounts = st.decimals(allow_nan=False, allow_infinity=False, places=4, max_value=10**12)
    days = st.dates(min_value=date(1000, 1, 1))
    await admin.execute("SET TimeZone = 'America/Sao_Paulo'")  # the session's zone is not UTC

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(moment=moments, amount=amounts, day=days)
    def check(moment: datetime, amount: Decimal, day: date) -> None:
        async def rendered() -> tuple[str, str, str]:
            row = await admin.fetchrow(
                "SELECT contextcore_isoformat($1), $2::numeric::text, $3::date::text",
                moment,
                amount,
                day,
            )
            assert row is not None
            return row[0], row[1], row[2]

        expected = (moment.isoformat(), format(amount, "f"), day.isoformat())
        assert asyncio.run_coroutine_threadsafe(rendered(), loop).result(30) == expected

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(check)
