"""Every source's item order is total: rows whose sort keys tie come back in the documented
order, whatever order they were written in (migration 00034; each source's docstring).

Each probe seeds rows that tie on the order's leading keys (the same timestamp, the same
position and name, the same distance to the query), written so that the order a scan meets them
in (physical, or an index's) is not the documented one, and asserts the documented one. Each
probe also fails in a database where the latest definition of its function was re-created
without the tie-breaker: a test that could not fail would prove nothing (as in
test_memory_rules). Where an index of the table already returns the ties in the documented
order, the removal drops that index too, so the scan meets them in physical order.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from contextcore.cache import TenantCache
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.search import SearchTuning
from contextcore.knowledge.encoding import Encoder
from contextcore.sources.conversation import ConversationContextSource
from contextcore.sources.definition_summary import DefinitionSummaryContextSource
from contextcore.sources.dossier import DossierContextSource
from contextcore.sources.knowledge import KnowledgeContextSource
from contextcore.sources.memory import MemoryContextSource
from contextcore.sources.run_history import RunHistoryContextSource
from contextcore.storage.migrations import load_migrations
from contextcore.storage.tenancy import TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ContextSubject
from tests.integration import seed

pytestmark = pytest.mark.integration

MOMENT = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
"""Every tied row's timestamp (within run_history's lookback)."""
LOW = uuid.UUID("00000000-0000-4000-8000-000000000001")
HIGH = uuid.UUID("ffffffff-ffff-4fff-bfff-ffffffffffff")
"""Two ids, written HIGH first where an order takes the id ascending, LOW first where it takes
it descending: the physical order is then the wrong one."""
USER = uuid.UUID("7d000000-0000-4000-8000-00000000e001")
DEFINITION = uuid.UUID("7d000000-0000-4000-8000-00000000d001")
DIMS = 384


def request(org: uuid.UUID, **fields: Any) -> ContextRequest:
    subject = ContextSubject(
        organization_id=org,
        user_id=fields.pop("user_id", None),
        trigger_id=None,
        definition_id=fields.pop("definition_id", None),
    )
    fields.setdefault("entities", ())
    fields.setdefault("query", "q")
    return ContextRequest(subject=subject, **fields)


def spec(name: str, limit: int | None = None, **options: Any) -> ContextSourceSpec:
    return ContextSourceSpec(name=name, token_budget=10_000, limit=limit, options=options)


def bodies(items: Sequence[ContextItem]) -> list[str]:
    return [item.body for item in items]


# --------------------------------------------------------------- the rules and their removal


def latest_definition(function: str) -> str:
    """The ``CREATE ... FUNCTION`` statement of the last migration that (re)defines
    ``function``, as a ``CREATE OR REPLACE``."""
    statement = re.compile(
        rf"^CREATE (?:OR REPLACE )?FUNCTION {function}\(.*?^\$\$;$", re.MULTILINE | re.DOTALL
    )
    found = [
        m.group(0) for migration in load_migrations() for m in statement.finditer(migration.sql)
    ]
    assert found, f"no migration defines {function}"
    return re.sub(r"^CREATE (?:OR REPLACE )?FUNCTION", "CREATE OR REPLACE FUNCTION", found[-1])


def without(function: str, *changes: tuple[str, str, int]) -> str:
    """``function``'s latest definition with each ``(text, replacement, count)`` applied; the
    count is checked, so a later migration that moves the text fails here, not silently."""
    sql = latest_definition(function)
    for old, new, count in changes:
        assert sql.count(old) == count, f"{function}: {old!r} found {sql.count(old)} times"
        sql = sql.replace(old, new)
    return sql


Probe = Callable[[asyncpg.Connection, TenantDatabase], Awaitable[None]]


@dataclass(frozen=True)
class Rule:
    removal: Callable[[], str]
    """SQL that re-creates the function without the tie-breaker (and drops an index that would
    return the ties in the documented order anyway)."""
    probe: Probe


# ------------------------------------------------------------------------------ conversation


async def conversation_messages_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Messages of one moment: newest first means the higher id first."""
    org = await seed.organization(admin)
    conversation = seed.new_id()
    await seed.insert(admin, "conversations", organization_id=org, id=conversation)
    for message_id, content in [(LOW, "low"), (HIGH, "high")]:
        await seed.insert(
            admin,
            "conversation_messages",
            organization_id=org,
            id=message_id,
            conversation_id=conversation,
            role="user",
            content=content,
            created_at=MOMENT,
        )
    source = ConversationContextSource(db)
    items = await source.retrieve(request(org, conversation_id=conversation), spec("conversation"))
    assert bodies(items) == ["high", "low"]
    capped = await source.retrieve(
        request(org, conversation_id=conversation), spec("conversation", 1)
    )
    assert bodies(capped) == ["high"]


# ---------------------------------------------------------------------------------- dossier


async def dossier_parts_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Services, customer profiles and offers of one position and one name: by id."""
    org = await seed.organization(admin)
    await seed.insert(admin, "company_profiles", organization_id=org, company_name="Acme")
    for row_id, description in [(HIGH, "high"), (LOW, "low")]:
        common = {"organization_id": org, "id": row_id, "name": "Same", "description": description}
        await seed.insert(admin, "dossier_services", **common, position=0)
        await seed.insert(admin, "ideal_customer_profiles", **common, position=0)
        await seed.insert(admin, "offers", **common, position=0)
    source = DossierContextSource(db, TenantCache("dossier"))
    items = await source.retrieve(request(org), spec("dossier", include_documents=False))
    assert [(item.title, item.body) for item in items] == [
        ("Company", "Name: Acme"),
        ("Services", "Same: low; Same: high"),
        ("Ideal customer profile: Same", "Description: low"),
        ("Ideal customer profile: Same", "Description: high"),
        ("Offer: Same", "Description: low"),
        ("Offer: Same", "Description: high"),
    ]


async def dossier_documents_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Documents of one moment: newest first means the higher id first, and the cap keeps it."""
    org = await seed.organization(admin)
    for row_id, title in [(LOW, "low"), (HIGH, "high")]:
        await seed.insert(
            admin,
            "organization_documents",
            organization_id=org,
            id=row_id,
            title=title,
            summary=title,
            created_at=MOMENT,
        )
    source = DossierContextSource(db, TenantCache("dossier"))
    items = await source.retrieve(request(org), spec("dossier"))
    assert [item.title for item in items] == ["Document: high", "Document: low", "Documents"]
    capped = await source.retrieve(request(org), spec("dossier", 1))
    assert [item.title for item in capped] == ["Document: high", "Documents"]


# ----------------------------------------------------------------------- definition_summary


async def definitions_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Two definitions of one kind and one name: by id."""
    org = await seed.organization(admin)
    for row_id, summary in [(HIGH, "high"), (LOW, "low")]:
        await seed.insert(
            admin,
            "definitions",
            id=row_id,
            organization_id=org,
            kind="agent",
            name="Helper",
            safe_summary=summary,
            status="published",
        )
    source = DefinitionSummaryContextSource(db, TenantCache("definitions"))
    assert bodies(await source.retrieve(request(org), spec("definition_summary"))) == [
        "low",
        "high",
    ]
    capped = await source.retrieve(request(org), spec("definition_summary", 1))
    assert bodies(capped) == ["low"]


# ------------------------------------------------------------------------------ run_history


async def runs_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Runs of one moment: newest first means the higher id first, and the cap keeps it."""
    org = await seed.organization(admin)
    for row_id, summary in [(LOW, "low"), (HIGH, "high")]:
        await seed.insert(
            admin,
            "runs",
            organization_id=org,
            id=row_id,
            user_id=USER,
            status="completed",
            result_summary=summary,
            created_at=MOMENT,
        )
    source = RunHistoryContextSource(db)
    options = {"lookback_hours": 720}
    items = await source.retrieve(request(org, user_id=USER), spec("run_history", **options))
    assert [item.ref.id for item in items if item.ref] == [str(HIGH), str(LOW)]
    capped = await source.retrieve(request(org, user_id=USER), spec("run_history", 1, **options))
    assert [item.ref.id for item in capped if item.ref] == [str(HIGH)]


# ----------------------------------------------------------------------------------- memory


async def memories_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Memories of one moment: newest first means the higher id first, with a definition and
    without one (the function's two queries)."""
    org = await seed.organization(admin)
    for row_id, attribute in [(LOW, "low"), (HIGH, "high")]:
        await admin.execute(
            "INSERT INTO memories (organization_id, id, definition_id, scope, subject_key, text,"
            " created_at) VALUES ($1, $2, $3, 'organization', $4, $5, $6)",
            org,
            row_id,
            DEFINITION,
            f"organization:{org}:observation.{attribute}",
            attribute,
            MOMENT,
        )
    source = MemoryContextSource(db)
    for definition in (DEFINITION, None):
        subject = request(org, user_id=USER, definition_id=definition)
        assert bodies(await source.retrieve(subject, spec("memory"))) == ["high", "low"]
        assert bodies(await source.retrieve(subject, spec("memory", 1))) == ["high"]


# -------------------------------------------------------------------------------- knowledge

QUERY_VECTOR = [1.0] + [0.0] * (DIMS - 1)


class OneVector:
    """Every text's embedding is ``QUERY_VECTOR``: every chunk below is as near as another."""

    model = DEFAULT_MODEL
    dimensions = DIMS

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        return [QUERY_VECTOR for _ in texts]


async def one_vector(model: str) -> Encoder:
    if model != DEFAULT_MODEL:
        raise KeyError(model)
    return OneVector()


async def seed_equal_chunks(admin: asyncpg.Connection, org: uuid.UUID) -> None:
    """Two ready documents with one chunk each, both at ``QUERY_VECTOR``: chunk 102 of the
    document with the lower source id, written first, then chunk 101 of the other. A scan
    meets 102 first, by the scope index (source id) and physically."""
    vector = "[" + ",".join(str(x) for x in QUERY_VECTOR) + "]"
    for source_id, chunk_id, title in [(LOW, 102, "low"), (HIGH, 101, "high")]:
        await admin.execute(
            "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
            " status, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/plain', 'ready', 'k')",
            source_id,
            org,
            title,
            f"docs://{source_id}",
        )
        await admin.execute(
            "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
            " generation, chunk_count, chunks_stored, status) VALUES ($1, $2, $3, 1, 1, 1,"
            " 'ready')",
            org,
            source_id,
            DEFAULT_MODEL,
        )
        await admin.execute(
            "INSERT INTO knowledge_chunks (id, organization_id, source_id, embedding_model,"
            " generation, ordinal, section, text, tokens, embedding) OVERRIDING SYSTEM VALUE"
            " VALUES ($1, $2, $3, $4, 1, 0, '', $5, 5, $6::vector)",
            chunk_id,
            org,
            source_id,
            DEFAULT_MODEL,
            f"passage of {title}",
            vector,
        )


def knowledge(db: TenantDatabase, candidates: int = 40) -> KnowledgeContextSource:
    tuning = SearchTuning(candidates=candidates)
    return KnowledgeContextSource(db, QueryVectors(one_vector), tuning=tuning)


def chunk_ids(items: Sequence[ContextItem]) -> list[str]:
    return [item.ref.id for item in items if item.ref]


# the query's one word is in no chunk: no lexical candidate, the vector side alone
ASK = {"query": "zyzzyva"}
ORGANIZATION_ONLY = {"include_organization": True}


async def knowledge_candidates_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """The vector side's cut falls between two chunks at one distance: the lower chunk id is the
    candidate (00034)."""
    org = await seed.organization(admin)
    await seed_equal_chunks(admin, org)
    source = knowledge(db, candidates=1)
    for results in ("documents", "chunks"):
        options: dict[str, Any] = {**ORGANIZATION_ONLY, "results": results}
        items = await source.retrieve(request(org, **ASK), spec("knowledge", **options))
        assert chunk_ids(items) == ["101"]


async def knowledge_documents_tie(admin: asyncpg.Connection, db: TenantDatabase) -> None:
    """Two documents of one score: the one whose first chunk has the lower id ranks first, and a
    limit of one document keeps that one alone."""
    org = await seed.organization(admin)
    await seed_equal_chunks(admin, org)
    source = knowledge(db)
    items = await source.retrieve(request(org, **ASK), spec("knowledge", **ORGANIZATION_ONLY))
    assert chunk_ids(items) == ["101", "102"]
    assert [item.rank_in_section for item in items] == [0, 1]
    one = await source.retrieve(request(org, **ASK), spec("knowledge", 1, **ORGANIZATION_ONLY))
    assert chunk_ids(one) == ["101"]


# ---------------------------------------------------------------------------------- the rules

_NEWEST = ("ORDER BY created_at DESC, id DESC", "ORDER BY created_at DESC")
RULES: dict[str, Rule] = {
    "conversation: messages by (created_at DESC, id DESC)": Rule(
        lambda: (
            without(
                "contextcore_read_conversation",
                (*_NEWEST, 1),
                ("ORDER BY m.created_at DESC, m.id DESC", "ORDER BY m.created_at DESC", 1),
            )
            + "\nDROP INDEX conversation_messages_recent_idx;"
        ),
        conversation_messages_tie,
    ),
    "dossier: parts by (position, name, id)": Rule(
        lambda: without(
            "contextcore_read_dossier",
            ("ORDER BY position, name, id)", "ORDER BY position, name)", 3),
        ),
        dossier_parts_tie,
    ),
    "dossier: documents by (created_at DESC, id DESC)": Rule(
        lambda: (
            without("contextcore_read_dossier", (*_NEWEST, 2))
            + "\nDROP INDEX organization_documents_active_idx;"
        ),
        dossier_documents_tie,
    ),
    "definition_summary: by (kind, name, id)": Rule(
        lambda: without("contextcore_read_definitions", ("kind, name, id\n", "kind, name\n", 1)),
        definitions_tie,
    ),
    "run_history: by (created_at DESC, id DESC)": Rule(
        lambda: without("contextcore_read_runs", (*_NEWEST, 1)) + "\nDROP INDEX runs_recent_idx;",
        runs_tie,
    ),
    "memory: by (created_at DESC, id DESC)": Rule(
        lambda: without(
            "contextcore_read_memories",
            ("ORDER BY m.created_at DESC, m.id DESC", "ORDER BY m.created_at DESC", 2),
        ),
        memories_tie,
    ),
    "knowledge: vector candidates by (distance, id)": Rule(
        lambda: (
            "SELECT '[0]'::vector;\n"
            + without("knowledge_search", ("<=> $1, c.id\n", "<=> $1\n", 1))
        ),
        knowledge_candidates_tie,
    ),
    "knowledge: documents by (score DESC, first chunk id)": Rule(
        lambda: (
            "SELECT '[0]'::vector;\n"
            + without(
                "knowledge_search",
                ("d.document_score DESC, d.first_chunk)", "d.document_score DESC)", 1),
            )
        ),
        knowledge_documents_tie,
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
async def test_the_order_is_total(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, rule: str
) -> None:
    await RULES[rule].probe(admin, tenant_db)


@pytest.mark.parametrize("rule", list(RULES))
async def test_its_probe_fails_without_the_tie_breaker(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, rule: str
) -> None:
    await admin.execute(RULES[rule].removal())
    with pytest.raises(AssertionError):
        await RULES[rule].probe(admin, tenant_db)
