"""dossier, definition_summary, conversation and run_history on a real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from consumers.build.sources import process_registry
from contextcore.cache import TenantCache
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.knowledge.adapters.search import KNOWLEDGE_MODELS_CHANNEL, LiveModels, live_models
from contextcore.packer import ContextPacker
from contextcore.registry import PolicyError
from contextcore.sources import definition_summary, dossier
from contextcore.sources.conversation import ConversationContextSource
from contextcore.sources.definition_summary import DefinitionSummaryContextSource
from contextcore.sources.dossier import DossierContextSource, Fact
from contextcore.sources.run_history import RunHistoryContextSource
from contextcore.storage.invalidation import CacheInvalidator
from contextcore.storage.tenancy import TenantDatabase
from contextcore.tokens import estimate_tokens
from schemas.context import (
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)
from tests.integration import seed
from tests.integration.helpers import until
from tests.services import Database

pytestmark = pytest.mark.integration
NOW = datetime.now(UTC)


def spec(name: str, limit: int | None = None, **options: Any) -> ContextSourceSpec:
    return ContextSourceSpec(name=name, token_budget=10_000, limit=limit, options=options)


def subject_request(org: uuid.UUID, **fields: Any) -> ContextRequest:
    subject = ContextSubject(
        organization_id=org,
        user_id=fields.pop("user_id", None),
        trigger_id=fields.pop("trigger_id", None),
        definition_id=None,
    )
    fields.setdefault("entities", ())
    return ContextRequest(subject=subject, query="q", **fields)


# ---------------------------------------------------------------------------------- dossier


async def dropped(cache: TenantCache[Any], organization: uuid.UUID) -> None:
    """Until the cache holds nothing of ``organization``: the listener drops it elsewhere."""
    await until(lambda: not cache.holds(organization), timeout=10, every=0.01)


async def seed_dossier(admin: asyncpg.Connection, org: uuid.UUID, documents: int = 3) -> None:
    await seed.insert(
        admin,
        "company_profiles",
        organization_id=org,
        company_name="Acme",
        industry="Robotics",
        value_proposition="Fewer outages",
    )
    for position, name in enumerate(["Audits", "Support"]):
        await seed.insert(
            admin,
            "dossier_services",
            organization_id=org,
            id=seed.new_id(),
            name=name,
            position=position,
        )
    await seed.insert(
        admin,
        "ideal_customer_profiles",
        organization_id=org,
        id=seed.new_id(),
        name="Mid-market ops",
        criteria="200-2000 staff",
    )
    await seed.insert(
        admin, "offers", organization_id=org, id=seed.new_id(), name="Pilot", price="5k"
    )
    for i in range(documents):
        await seed.insert(
            admin,
            "organization_documents",
            organization_id=org,
            id=seed.new_id(),
            title=f"Doc {i}",
            summary=f"About {i}",
            created_at=NOW - timedelta(days=documents - i),
        )
    await seed.insert(
        admin,
        "organization_documents",
        organization_id=org,
        id=seed.new_id(),
        title="Old",
        status="archived",
    )


async def test_dossier_items_in_the_design_order(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org = await seed.organization(admin)
    await seed_dossier(admin, org)
    user = seed.new_id()
    await seed.insert(
        admin,
        "organization_members",
        organization_id=org,
        user_id=user,
        full_name="Dana",
        title="Head of Sales",
    )
    source = DossierContextSource(tenant_db, TenantCache("dossier"))
    items = await source.retrieve(
        subject_request(org, user_id=user), spec("dossier", include_user=True)
    )
    assert [i.title for i in items] == [
        "Company",
        "Services",
        "Ideal customer profile: Mid-market ops",
        "Offer: Pilot",
        "User",
        "Document: Doc 2",
        "Document: Doc 1",
        "Document: Doc 0",
        "Documents",
    ]
    assert items[0].body == "Name: Acme. Industry: Robotics. Value proposition: Fewer outages"
    assert items[1].body == "Audits; Support"
    assert items[-1].body == "The organization's settings list 3 active document(s)."
    assert all(i.ref is None and i.subject_key is None for i in items)

    capped = await source.retrieve(subject_request(org), spec("dossier", limit=1))
    assert [i.title for i in capped][-2:] == ["Document: Doc 2", "Documents"]
    assert capped[-1].body == "The organization's settings list 3 active document(s)."
    assert "User" not in [i.title for i in capped]  # include_user defaults to false
    no_user = await source.retrieve(subject_request(org), spec("dossier", include_user=True))
    assert "User" not in [i.title for i in no_user]  # a subject with no user: no section
    bare = await source.retrieve(subject_request(org), spec("dossier", include_documents=False))
    assert [i.title for i in bare][-1] == "Offer: Pilot"
    assert await source.retrieve(subject_request(org), spec("dossier", limit=0)) == []


async def test_dossier_cache_is_invalidated_by_a_write_from_another_connection(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    org = await seed.organization(admin)
    await seed_dossier(admin, org, documents=0)
    cache: TenantCache[list[Fact]] = TenantCache("dossier")
    invalidator = CacheInvalidator({dossier.CHANNEL: cache}, database.url)  # the runtime login
    await invalidator.start()
    try:
        source = DossierContextSource(tenant_db, cache)

        async def offers() -> list[str]:
            items = await source.retrieve(subject_request(org), spec("dossier"))
            return [i.title for i in items if i.title.startswith("Offer")]

        assert await offers() == ["Offer: Pilot"]
        # A write with the notify trigger off proves the cache serves the cached part...
        await admin.execute("ALTER TABLE offers DISABLE TRIGGER offers_notify_dossier")
        await admin.execute("UPDATE offers SET name = 'Silent' WHERE organization_id = $1", org)
        await admin.execute("ALTER TABLE offers ENABLE TRIGGER offers_notify_dossier")
        assert await offers() == ["Offer: Pilot"]
        # ...and an ordinary write through another connection invalidates it for every process.
        writer = await asyncpg.connect(database.admin_url)  # the application's own write
        try:
            await writer.execute("UPDATE offers SET name = 'Scale' WHERE organization_id = $1", org)
        finally:
            await writer.close()
        await dropped(cache, org)
        assert await offers() == ["Offer: Scale"]
    finally:
        await invalidator.stop()


async def test_a_cached_dossier_is_each_users_own_and_sees_documents_and_members_change(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    """The whole dossier is cached (migration 00031 notifies document and member writes): the
    user part is each asking user's own, and a new document or a changed member is seen by the
    next read."""
    org = await seed.organization(admin)
    await seed_dossier(admin, org, documents=1)
    dana, eli = seed.new_id(), seed.new_id()
    for user, name in ((dana, "Dana"), (eli, "Eli")):
        await seed.insert(
            admin, "organization_members", organization_id=org, user_id=user, full_name=name
        )
    cache: TenantCache[list[Fact]] = TenantCache("dossier")
    invalidator = CacheInvalidator({dossier.CHANNEL: cache}, database.url)
    await invalidator.start()
    source = DossierContextSource(tenant_db, cache)

    async def bodies(user: uuid.UUID) -> list[str]:
        request = subject_request(org, user_id=user)
        items = await source.retrieve(request, spec("dossier", include_user=True))
        return [i.body for i in items if i.title in ("User", "Documents")]

    try:
        assert await bodies(dana) == [
            "Name: Dana",
            "The organization's settings list 1 active document(s).",
        ]
        assert await bodies(eli) == [
            "Name: Eli",
            "The organization's settings list 1 active document(s).",
        ]
        assert await bodies(dana) == [
            "Name: Dana",
            "The organization's settings list 1 active document(s).",
        ]
        assert (cache.hits, cache.misses) == (1, 2)
        await seed.insert(
            admin,
            "organization_documents",
            organization_id=org,
            id=seed.new_id(),
            title="New",
            status="active",
        )
        await dropped(cache, org)
        assert await bodies(dana) == [
            "Name: Dana",
            "The organization's settings list 2 active document(s).",
        ]
        await admin.execute(
            "UPDATE organization_members SET title = 'CEO' WHERE user_id = $1", dana
        )
        await dropped(cache, org)
        assert (await bodies(dana))[0] == "Name: Dana. Title: CEO"
    finally:
        await invalidator.stop()


async def test_a_lost_listener_turns_caching_off_until_it_reconnects(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database_url: str
) -> None:
    org = await seed.organization(admin)
    await seed_dossier(admin, org, documents=0)
    cache: TenantCache[list[Fact]] = TenantCache("dossier")
    invalidator = CacheInvalidator({dossier.CHANNEL: cache}, database_url, reconnect_delay_s=0.05)
    await invalidator.start()
    source = DossierContextSource(tenant_db, cache)
    try:
        await source.retrieve(subject_request(org), spec("dossier"))
        assert cache.holds(org)
        killed = await admin.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN %contextcore_dossier%' AND pid <> pg_backend_pid()"
            " AND datname = current_database()"  # this test's: other tests run beside it
        )
        assert killed is True
        await dropped(cache, org)  # the loss drops every entry (no write happened)
        await until(lambda: cache.listening, timeout=10, every=0.01)  # reconnected
        await source.retrieve(subject_request(org), spec("dossier"))
        assert cache.holds(org)
        await admin.execute("UPDATE offers SET name = 'After' WHERE organization_id = $1", org)
        await dropped(cache, org)
    finally:
        await invalidator.stop()


# ---------------------------------------------------------------------- definition summaries


async def test_definition_summaries_are_the_visible_published_ones_of_org_and_platform(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    rows = [
        (org, "agent", "Researcher", "published", "listed"),
        (org, "skill", "Draft skill", "draft", "listed"),
        (org, "workflow", "Hidden flow", "published", "hidden"),
        (None, "workflow", "Onboarding", "published", "listed"),
        (other, "agent", "Their agent", "published", "listed"),
    ]
    for organization_id, kind, name, status, visibility in rows:
        await seed.insert(
            admin,
            "definitions",
            id=seed.new_id(),
            organization_id=organization_id,
            kind=kind,
            name=name,
            safe_summary=f"{name} summary",
            status=status,
            visibility=visibility,
        )
    source = DefinitionSummaryContextSource(tenant_db, TenantCache("definition_summary"))
    items = await source.retrieve(subject_request(org), spec("definition_summary"))
    assert [(i.title, i.body) for i in items] == [
        ("Agent Researcher", "Researcher summary"),
        ("Workflow Onboarding", "Onboarding summary"),
    ]
    assert [
        i.title
        for i in await source.retrieve(subject_request(org), spec("definition_summary", limit=1))
    ] == ["Agent Researcher"]


async def definition(admin: asyncpg.Connection, org: uuid.UUID | None, name: str) -> uuid.UUID:
    row_id = seed.new_id()
    await seed.insert(
        admin,
        "definitions",
        id=row_id,
        organization_id=org,
        kind="agent",
        name=name,
        safe_summary=f"{name} summary",
        status="published",
        visibility="listed",
    )
    return row_id


async def test_cached_definitions_are_each_organizations_own_and_every_write_is_seen(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    """Two organizations' reads are cached side by side and never answer each other; a write
    from another connection drops that organization's entries, a platform write every
    organization's, in every process that listens."""
    org, other = await seed.organization(admin), await seed.organization(admin)
    mine = await definition(admin, org, "Mine")
    await definition(admin, other, "Theirs")
    cache: TenantCache[list[definition_summary.Row]] = TenantCache("definition_summary")
    invalidator = CacheInvalidator({definition_summary.CHANNEL: cache}, database.url)
    await invalidator.start()
    source = DefinitionSummaryContextSource(tenant_db, cache)

    async def names(organization: uuid.UUID) -> list[str]:
        items = await source.retrieve(subject_request(organization), spec("definition_summary"))
        return [i.title for i in items]

    try:
        assert await names(org) == ["Agent Mine"]
        assert await names(other) == ["Agent Theirs"]
        assert (cache.hits, cache.misses) == (0, 2)
        assert await names(org) == ["Agent Mine"]
        assert await names(other) == ["Agent Theirs"]  # each from its own entry
        assert (cache.hits, cache.misses) == (2, 2)
        await admin.execute("UPDATE definitions SET name = 'Renamed' WHERE id = $1", mine)
        await dropped(cache, org)
        assert await names(org) == ["Agent Renamed"]
        assert cache.holds(other)  # another organization's write: kept
        await definition(admin, None, "Platform")  # a platform row: every entry goes
        await dropped(cache, other)
        assert await names(other) == ["Agent Theirs", "Agent Platform"]
    finally:
        await invalidator.stop()


async def test_cached_live_models_are_dropped_by_every_knowledge_settings_write(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    """The knowledge source's cache of live models (migration 00032): an organization's
    settings write drops its entry, the platform's row every entry, in every process."""
    org, other = await seed.organization(admin), await seed.organization(admin)
    cache: TenantCache[LiveModels] = TenantCache("knowledge_models")
    invalidator = CacheInvalidator({KNOWLEDGE_MODELS_CHANNEL: cache}, database.url)
    await invalidator.start()

    try:
        assert await live_models(tenant_db, org, cache) == (DEFAULT_MODEL, DEFAULT_MODEL)
        assert await live_models(tenant_db, other, cache) == (DEFAULT_MODEL, DEFAULT_MODEL)
        assert cache.holds(org)
        assert cache.holds(other)
        await seed.insert(
            admin, "knowledge_settings", organization_id=org, active_embedding_model=DEFAULT_MODEL
        )
        await dropped(cache, org)
        assert cache.holds(other)
        await admin.execute(
            "UPDATE knowledge_settings SET updated_at = now() WHERE organization_id IS NULL"
        )
        await dropped(cache, other)
    finally:
        await invalidator.stop()


# ------------------------------------------------------------------------------ conversation


async def test_conversation_newest_first_rendered_oldest_first(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    conversation = seed.new_id()
    await seed.insert(
        admin, "conversations", organization_id=org, id=conversation, summary="They want a pilot"
    )
    for i, role in enumerate(["user", "assistant", "user"]):
        await seed.insert(
            admin,
            "conversation_messages",
            organization_id=org,
            id=seed.new_id(),
            conversation_id=conversation,
            role=role,
            content=f"m{i}",
            created_at=NOW + timedelta(seconds=i),
        )
    source = ConversationContextSource(tenant_db)
    assert await source.retrieve(subject_request(org), spec("conversation")) == []
    items = await source.retrieve(
        subject_request(org, conversation_id=conversation), spec("conversation")
    )
    assert [i.body for i in items] == ["They want a pilot", "m2", "m1", "m0"]
    assert all(i.subject_key is None for i in items)
    summary_line = f"- [conversation:{conversation}] Summary so far: They want a pilot"
    budget = sum(
        estimate_tokens(line + "\n")
        for line in [
            "## Conversation",
            summary_line,
            "- Assistant: m1",
            "- User: m2",
        ]
    )  # one token short of the oldest message too
    policy = ContextPolicy(
        total_token_budget=budget,
        sources=[ContextSourceSpec(name="conversation", token_budget=budget)],
    )
    brief = ContextPacker().pack(items, policy)
    # the oldest message is cut first; the kept ones read oldest to newest after the summary
    assert brief.text.splitlines()[1:] == [
        summary_line,
        "- Assistant: m1",
        "- User: m2",
    ]
    foreign = await source.retrieve(
        subject_request(other, conversation_id=conversation), spec("conversation")
    )
    assert foreign == []
    assert (
        await source.retrieve(
            subject_request(org, conversation_id=conversation), spec("conversation", limit=0)
        )
        == []
    )


async def test_a_personal_conversation_is_read_only_for_its_own_user(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Issue 7, defect 7: a conversation with a user_id belongs to that person."""
    org = await seed.organization(admin)
    ada, grace = seed.new_id(), seed.new_id()
    mine, shared = seed.new_id(), seed.new_id()
    await seed.insert(
        admin, "conversations", organization_id=org, id=mine, user_id=ada, summary="Ada's"
    )
    await seed.insert(admin, "conversations", organization_id=org, id=shared, summary="Team's")
    for conversation in (mine, shared):
        await seed.insert(
            admin,
            "conversation_messages",
            organization_id=org,
            id=seed.new_id(),
            conversation_id=conversation,
            role="user",
            content="hello",
        )
    source = ConversationContextSource(tenant_db)

    async def bodies(conversation: uuid.UUID, user: uuid.UUID | None) -> list[str]:
        request = subject_request(org, conversation_id=conversation, user_id=user)
        return [item.body for item in await source.retrieve(request, spec("conversation"))]

    assert await bodies(mine, ada) == ["Ada's", "hello"]
    assert await bodies(mine, grace) == []  # another member of the same organization
    assert await bodies(mine, None) == []  # a trigger or a turn without a user
    assert await bodies(shared, grace) == ["Team's", "hello"]  # no owner: the organization's
    assert await bodies(shared, None) == ["Team's", "hello"]


# ------------------------------------------------------------------------------ run history


async def run(admin: asyncpg.Connection, org: uuid.UUID, **values: Any) -> uuid.UUID:
    run_id: uuid.UUID = values.pop("id", seed.new_id())
    values.setdefault("status", "completed")
    await seed.insert(admin, "runs", organization_id=org, id=run_id, **values)
    return run_id


async def test_run_history_filters_order_and_body(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org, other = await seed.organization(admin), await seed.organization(admin)
    user, someone, trigger = seed.new_id(), seed.new_id(), seed.new_id()
    deal = str(seed.new_id())
    long_id = "x" * 80
    mine = await run(
        admin,
        org,
        user_id=user,
        created_at=NOW - timedelta(hours=1),
        result_summary="Drafted the renewal",
        result_refs=[
            {"kind": "crm_deal", "id": deal},
            {"kind": "crm_company", "id": long_id},
            {"kind": "unmapped", "id": "zzz"},
            {"id": "no kind"},
        ],
    )
    child = await run(
        admin,
        org,
        user_id=someone,
        parent_run_id=mine,
        status="failed",
        failure_reason="CRM timed out",
        created_at=NOW - timedelta(minutes=30),
        result_refs=[{"kind": "deal", "id": deal}],
    )
    by_trigger = await run(
        admin,
        org,
        trigger_id=trigger,
        status="waiting",
        waiting_reason="needs approval",
        created_at=NOW - timedelta(hours=2),
    )
    current = await run(admin, org, user_id=user, created_at=NOW)
    await run(admin, org, user_id=user, created_at=NOW - timedelta(hours=30))  # outside 24 h
    await run(admin, org, user_id=someone, created_at=NOW)  # another person, no entity
    await run(admin, other, user_id=user, created_at=NOW)  # another tenant
    source = RunHistoryContextSource(tenant_db)
    request = subject_request(
        org,
        user_id=user,
        trigger_id=trigger,
        run_id=current,
        entities=(ResourceRef(kind="crm.deal", id=deal),),
    )
    items = await source.retrieve(request, spec("run_history"))
    assert [i.ref.id if i.ref else None for i in items] == [str(child), str(mine), str(by_trigger)]
    assert [i.title for i in items] == ["Run failed", "Run completed", "Run waiting"]
    assert items[0].body == (
        f"Failed. Parent run {mine}. Refs: crm.deal {deal}. Failed: CRM timed out"
    )
    assert items[1].body == (
        f"Completed. Result: Drafted the renewal. Refs: crm.deal {deal}, crm.company {'x' * 63}…"
    )
    assert items[1].body_refs == [ResourceRef(kind="crm_deal", id=deal)]  # the stored word
    assert items[2].body == "Waiting. Waiting: needs approval"
    assert all(i.subject_key is None for i in items)
    assert items[1].recorded_at is not None

    wide = await source.retrieve(request, spec("run_history", lookback_hours=48))
    assert len(wide) == 4
    assert [i.title for i in await source.retrieve(request, spec("run_history", limit=1))] == [
        "Run failed"
    ]
    assert await source.retrieve(request, spec("run_history", limit=0)) == []


async def test_run_history_default_limit_is_five(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    org = await seed.organization(admin)
    user = seed.new_id()
    for i in range(8):
        await run(admin, org, user_id=user, created_at=NOW - timedelta(minutes=i))
    items = await RunHistoryContextSource(tenant_db).retrieve(
        subject_request(org, user_id=user), spec("run_history")
    )
    assert len(items) == 5


@pytest.mark.parametrize(
    ("options", "path"),
    [
        ({"lookback_hours": 0}, "sources[0].options.lookback_hours"),
        ({"lookback_hours": 721}, "sources[0].options.lookback_hours"),
        ({"lookback_hours": "24"}, "sources[0].options.lookback_hours"),
        ({"include_platform": True}, "sources[0].options.include_platform"),
    ],
)
def test_run_history_options_are_admitted_strictly(options: dict[str, Any], path: str) -> None:
    policy = ContextPolicy(
        total_token_budget=10,
        sources=[ContextSourceSpec(name="run_history", token_budget=5, options=options)],
    )
    with pytest.raises(PolicyError) as raised:
        process_registry().validate_policy(policy)
    assert raised.value.path == path


def test_the_process_registry_serves_the_seven_sources() -> None:
    assert process_registry().names == [
        "conversation",
        "application",
        "dossier",
        "definition_summary",
        "run_history",
        "knowledge",
        "memory",
    ]
    json.dumps(process_registry().names)
