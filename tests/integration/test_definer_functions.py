"""Null never opens a scope (issue 32, item 3; migration 00035; docs/tenancy.md).

SQL's logic has three values: a guard such as ``IF NOT contextcore_in_scope(org) THEN RAISE``
raises nothing when the test is null, and the function goes on as if it passed. These tests
call, as the runtime login (the service role for its session, as every consumer's pool), every
SECURITY DEFINER function the catalog holds, and every row policy's table, against the rows of
a victim organization B, from no scope, from an attacker organization A's scope and from the
platform's, with each argument null in turn, and expect a refusal (an error) or nothing: never
B's rows.

The catalog decides what is called: a definer function without an entry in ``DEFINERS`` fails
the suite, so a new one cannot arrive untested. Platform rows (a null organization) of the
knowledge tables and definitions are shared with every scope by design (docs/tenancy.md); the
victim's data is B's, and those platform rows say nothing B wrote.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import asyncpg
import pytest

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.storage.tenancy import PLATFORM, Connection, TenantDatabase
from tests.integration import seed
from tests.services import Database

pytestmark = pytest.mark.integration

WORD = "mango"
"""The word B's chunk says: the word reads are asked for it."""
VECTOR = "[" + ",".join(["0.05"] * 384) + "]"  # the default model's dimensions

# ------------------------------------------------------------------------------ the victim


def _id() -> uuid.UUID:
    return uuid.uuid4()


@dataclass
class Victim:
    """Organization B's rows, and what a caller outside B must never be answered."""

    attacker: uuid.UUID  # A: the scope an attacker holds
    organization: uuid.UUID = field(default_factory=_id)  # B
    definition: uuid.UUID = field(default_factory=_id)
    user: uuid.UUID = field(default_factory=_id)
    source: uuid.UUID = field(default_factory=_id)  # ready, one chunk that says WORD
    pending_source: uuid.UUID = field(default_factory=_id)  # pending since now: never swept
    memory: uuid.UUID = field(default_factory=_id)  # organization scope
    user_memory: uuid.UUID = field(default_factory=_id)  # the user's scope
    chunk: int = 0  # the chunk of `source`
    secrets: list[str] = field(default_factory=list)
    """Every text of B's rows (each unique) and B's ids: none may reach another scope unless
    the caller named it itself."""
    memory_key: str = ""  # `memory`'s subject key
    journal_key: str = ""  # the journal's answer to this key names `memory`
    journal_digest: str = ""

    def __post_init__(self) -> None:
        self.secrets += [
            str(x)
            for x in (
                self.organization,
                self.definition,
                self.user,
                self.source,
                self.pending_source,
                self.memory,
                self.user_memory,
            )
        ]
        self.memory_key = f"organization:{self.organization}:observation.{self.secret('key')}"
        self.journal_key = self.secret("idempotency")
        self.journal_digest = uuid.uuid4().hex * 2
        self.secrets.append(self.journal_digest)

    def secret(self, label: str) -> str:
        value = f"B{label}{uuid.uuid4().hex[:12]}"
        self.secrets.append(value)
        return value

    def new_id(self) -> uuid.UUID:
        value = uuid.uuid4()
        self.secrets.append(str(value))
        return value


async def victim(admin: asyncpg.Connection) -> Victim:
    """B with a row in every table that has row security, A with none, and a platform row in
    every table whose organization may be null. Written by the administrator (the
    application that owns the rows)."""
    v = Victim(attacker=await seed.organization(admin, "A"))
    b = v.organization
    await seed.insert(admin, "organizations", id=b, name=v.secret("name"))
    one = {"organization_id": b}
    company, person, prospect, conversation = v.new_id(), v.new_id(), v.new_id(), v.new_id()
    for table, values in (
        ("organization_members", {"user_id": v.user, "full_name": v.secret("member")}),
        ("crm_companies", {"id": company, "name": v.secret("company")}),
        ("crm_people", {"id": person, "full_name": v.secret("person"), "company_id": company}),
        ("crm_deals", {"id": v.new_id(), "name": v.secret("deal"), "company_id": company}),
        ("crm_activities", {"id": v.new_id(), "type": "call", "subject": v.secret("call")}),
        ("crm_lists", {"id": v.new_id(), "name": v.secret("list")}),
        ("prospects", {"id": prospect, "opportunity_reason": v.secret("reason")}),
        (
            "prospect_people",
            {"id": v.new_id(), "prospect_id": prospect, "full_name": v.secret("prospect")},
        ),
        ("company_profiles", {"company_name": v.secret("profile")}),
        ("dossier_services", {"id": v.new_id(), "name": v.secret("service")}),
        ("ideal_customer_profiles", {"id": v.new_id(), "name": v.secret("icp")}),
        ("offers", {"id": v.new_id(), "name": v.secret("offer")}),
        ("organization_documents", {"id": v.new_id(), "title": v.secret("document")}),
        (
            "definitions",
            {
                "id": v.definition,
                "kind": "agent",
                "name": v.secret("agent"),
                "safe_summary": v.secret("summary"),
                "status": "published",
            },
        ),
        ("conversations", {"id": conversation, "title": v.secret("conversation")}),
        (
            "conversation_messages",
            {
                "id": v.new_id(),
                "conversation_id": conversation,
                "role": "user",
                "content": v.secret("message"),
            },
        ),
        ("runs", {"id": v.new_id(), "status": "completed", "result_summary": v.secret("run")}),
        ("processed_messages", {"consumer": "memory", "message_id": v.secret("claim")}),
        (
            "memory_refusals",
            {"day": date.today(), "operation": "remember", "reason": "invalid_input", "calls": 3},
        ),
        ("knowledge_settings", {"active_embedding_model": DEFAULT_MODEL}),
    ):
        await seed.insert(admin, table, **one, **values)
    v.chunk = await knowledge(admin, b, v.source, v.secret("title"), f"{v.secret('text')} {WORD}")
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, pending_since, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/plain',"
        " 'pending', now(), 'k')",
        v.pending_source,
        b,
        v.secret("pending"),
        f"docs://{v.secret('uri')}",
    )
    await admin.execute(
        "INSERT INTO knowledge_deletions (organization_id, source_id, title, identity, chunks)"
        " VALUES ($1, $2, $3, $4, 1)",
        b,
        v.new_id(),
        v.secret("deleted"),
        v.secret("identity"),
    )
    # memories: one of the organization, one of the user, and the journal's answer to the first
    await seed.insert(
        admin,
        "memories",
        **one,
        id=v.memory,
        definition_id=v.definition,
        scope="organization",
        subject_key=v.memory_key,
        text=v.secret("memory"),
    )
    await seed.insert(
        admin,
        "memories",
        **one,
        id=v.user_memory,
        definition_id=v.definition,
        scope="user",
        user_id=v.user,
        subject_key=f"user:{v.user}:preference.{v.secret('preference')}",
        text=v.secret("preference"),
    )
    await seed.insert(
        admin,
        "memory_writes",
        **one,
        idempotency_key=v.journal_key,
        request_sha256=v.journal_digest,
        operation="remember",
        outcome="created",
        memory_id=v.memory,
    )
    await admin.execute(
        "INSERT INTO memory_erasures (organization_id, erased_by, selector, selected, chains,"
        " revisions, journal_rows, memory_ids) VALUES ($1, 'admin', 'subject', $2, 0, 0, 0, '{}')",
        b,
        f"contact:{v.secret('erased')}",
    )
    await admin.execute(
        "INSERT INTO organization_quotas (organization_id, build_rate, memory_revisions)"
        " VALUES ($1, 7, 70)",
        b,
    )
    # the platform's rows: shared in some tables by design, in none other
    await seed.insert(
        admin,
        "definitions",
        id=uuid.uuid4(),
        kind="agent",
        name="platform",
        safe_summary="platform agent",
        status="published",
    )
    await knowledge(admin, None, uuid.uuid4(), "platform guide", "platform guide")
    await admin.execute(
        "INSERT INTO knowledge_deletions (source_id, title, identity, chunks)"
        " VALUES ($1, 'platform', 'docs://platform', 1)",
        uuid.uuid4(),
    )
    await seed.insert(admin, "processed_messages", consumer="upload", message_id="platform")
    await admin.execute("INSERT INTO organization_quotas (build_rate) VALUES (1000)")  # default
    return v


async def knowledge(
    admin: asyncpg.Connection,
    organization: uuid.UUID | None,
    source: uuid.UUID,
    title: str,
    text: str,
) -> int:
    """A ready source with one chunk under the default model; the chunk's id."""
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/plain', 'ready', 'k')",
        source,
        organization,
        title,
        f"docs://{source}",
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status) VALUES ($1, $2, $3, 1, 1, 1, 'ready')",
        organization,
        source,
        DEFAULT_MODEL,
    )
    chunk: int = await admin.fetchval(
        "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation,"
        " ordinal, section, text, tokens, embedding) VALUES ($1, $2, $3, 1, 0, $4, $5, 5,"
        " $6::vector) RETURNING id",
        organization,
        source,
        DEFAULT_MODEL,
        title,
        text,
        VECTOR,
    )
    return chunk


# ------------------------------------------------------------------ where the attacker calls

NO_SCOPE, A_SCOPE, PLATFORM_SCOPE, LOGIN = (
    "no scope",
    "A's scope",
    "the platform's scope",
    "the login itself",
)


@asynccontextmanager
async def entered(
    where: str, tenant_db: TenantDatabase, database: Database, v: Victim
) -> AsyncIterator[Connection]:
    """A read-write transaction of the runtime login: the service role in no scope (as a
    consumer's idle connection, or memory_apply's transaction), in A's or the platform's
    scope; or the login without the service role, which may do nothing at all."""
    if where == NO_SCOPE:
        async with tenant_db.writing_each() as conn:
            yield conn
    elif where in (A_SCOPE, PLATFORM_SCOPE):
        async with tenant_db.writing(v.attacker if where == A_SCOPE else PLATFORM) as tenant:
            yield tenant._conn
    else:
        conn = await asyncpg.connect(database.url)
        try:
            async with conn.transaction():
                yield conn
        finally:
            await conn.close()


def refused(error: asyncpg.PostgresError) -> bool:
    """An error the database answers a caller with, not one of this test's own SQL (class 42
    but for 42501, insufficient privilege: an undefined function or a bad cast here would
    otherwise pass as a refusal)."""
    return not error.sqlstate.startswith("42") or error.sqlstate == "42501"


async def attempt(
    conn: Connection, sql: str, args: Sequence[object]
) -> list[asyncpg.Record] | asyncpg.PostgresError:
    """One statement in a savepoint: its rows (kept, committed with the transaction), or the
    error (rolled back, the transaction goes on)."""
    await conn.execute("SAVEPOINT attempt")
    try:
        rows = list(await conn.fetch(sql, *args))
    except asyncpg.PostgresError as error:
        await conn.execute("ROLLBACK TO SAVEPOINT attempt")
        failure = error
    else:
        await conn.execute("RELEASE SAVEPOINT attempt")
        return rows
    if not refused(failure):
        raise AssertionError(f"the test's own statement failed: {sql} {args}: {failure!r}")
    return failure


# --------------------------------------------------------------- the definer functions' table

Args = tuple[str | None, ...]
Answer = Callable[[str, list[asyncpg.Record]], bool]


def empty(value: object) -> bool:
    if isinstance(value, list | tuple):
        return all(empty(item) for item in value)
    return value is None or value == 0 or value == ""


def nothing(where: str, rows: list[asyncpg.Record]) -> bool:
    """No row, or only nulls, zeros and empty arrays (a count of nothing)."""
    return all(empty(list(row.values())) for row in rows)


def never(where: str, rows: list[asyncpg.Record]) -> bool:
    """The service role may not run it: any answer is wrong."""
    return False


def counts(where: str, rows: list[asyncpg.Record]) -> bool:
    """Numbers across tenants, by design: no id or text of B (checked for every answer)."""
    return all(
        all(isinstance(value, int | float | str) or value is None for value in row.values())
        for row in rows
    )


def platform_count(where: str, rows: list[asyncpg.Record]) -> bool:
    """Refused outside the platform's scope; there, a count across tenants by design."""
    return where == PLATFORM_SCOPE and counts(where, rows)


def refusals(where: str, rows: list[asyncpg.Record]) -> bool:
    """Every write refused, no revision named."""
    return all(row["outcome"] == "refused" and row["id"] is None for row in rows)


@dataclass(frozen=True)
class Definer:
    """How the test calls one SECURITY DEFINER function and what it may answer.

    ``calls(victim)``: argument lists, as text, aimed at B; each is also tried with each
    argument null in turn.
    ``fire``: for a trigger function, the statement that fires it, taking the arguments (a
    direct call must be refused).
    """

    calls: Callable[[Victim], list[Args]]
    answer: Answer = nothing
    fire: str | None = None
    why: str = ""
    """Why an answer may reach across tenants by design, or why the call is always refused."""


DIGEST = "\\x" + "ab" * 32
"""A start journal digest (32 bytes), as bytea text."""
WORD_COUNTS = "knowledge_word_counts(uuid,boolean,boolean,text,tsquery[])"
WORD_CANDIDATES = (
    "knowledge_word_candidates(uuid,boolean,boolean,text,tsquery,tsquery[],double precision[],"
    "uuid[],integer)"
)


def word_counts(v: Victim) -> list[Args]:
    b = str(v.organization)
    return [
        (b, own_and_platform, "true", DEFAULT_MODEL, f"{{{WORD}}}")
        for own_and_platform in ("false", "true")
    ]


def word_candidates(v: Victim) -> list[Args]:
    b = str(v.organization)
    return [
        (b, platform, "true", DEFAULT_MODEL, WORD, f"{{{WORD}}}", "{1}", "{}", "10")
        for platform in ("false", "true")
    ]


def memory_writes(v: Victim) -> list[dict[str, Any]]:
    """Writes that reach for B's memories. The organization a write names is trusted (it
    becomes the scope, as the memory consumer's writing_each transaction relies on), so a
    complete write naming B is B's own: these name A and reach B's rows through every other
    field, or name B with one field null in turn."""
    b, a = str(v.organization), str(v.attacker)
    forget: dict[str, Any] = {
        "organization_id": b,
        "request_sha256": "a" * 64,
        "operation": "forget",
        "definition_id": str(v.definition),
        "run_id": None,
        "memory_id": str(v.memory),
        "user_id": None,
    }
    users: dict[str, Any] = {**forget, "memory_id": str(v.user_memory), "user_id": str(v.user)}
    replay: dict[str, Any] = {
        "organization_id": b,
        "idempotency_key": v.journal_key,
        "request_sha256": v.journal_digest,
        "operation": "remember",
        "definition_id": str(v.definition),
    }
    remember: dict[str, Any] = {
        "organization_id": b,
        "request_sha256": "b" * 64,
        "operation": "remember",
        "definition_id": str(v.definition),
        "scope": "organization",
        "scope_owner_id": b,
        "subject_key": v.memory_key,
        "text": "attack",
        "subject_refs": [],
    }
    writes: list[dict[str, Any]] = [
        {**forget, "organization_id": a},
        {**replay, "organization_id": a},
        {**replay, "request_sha256": None},
    ]
    for name in (
        "organization_id",
        "request_sha256",
        "operation",
        "definition_id",
        "memory_id",
        "idempotency_key",
    ):
        writes.append({**forget, name: None})
    writes += [{**users, "user_id": None}, {**users, "definition_id": None}]
    for name in ("definition_id", "scope", "scope_owner_id", "subject_key", "text", "subject_refs"):
        writes.append({**remember, name: None})
    return [{"idempotency_key": f"attack:{n}", **w} for n, w in enumerate(writes)]


DEFINERS: dict[str, Definer] = {
    "contextcore_fail_stale_knowledge(interval,integer)": Definer(
        lambda v: [("1 hour", "100"), ("-1000 years", "1000")],
        why="across tenants by design (the sweep); B's pending source is fresh",
    ),
    "contextcore_journal_forget(text,text,integer[],bigint[])": Definer(
        lambda v: [("contextcore-build", "contextcore.build-request", "{0,1}", "{9,9}")],
        why="the start journal: infrastructure, no tenant's row (00036)",
    ),
    "contextcore_journal_prune(interval,integer)": Definer(
        lambda v: [("1 week", "100")], counts, why="the start journal (00036): a count"
    ),
    "contextcore_journal_solo(text,text,integer,bigint,bytea,integer)": Definer(
        lambda v: [("contextcore-build", "contextcore.build-request", "0", "5", DIGEST, "1")],
        why="the start journal (00036)",
    ),
    "contextcore_journal_started(text,text,integer[],bigint[],bytea[])": Definer(
        lambda v: [
            (
                "contextcore-build",
                "contextcore.build-request",
                "{0}",
                "{5}",
                '{"' + DIGEST.replace("\\", "\\\\") + '"}',
            )
        ],
        counts,
        why="the start journal (00036): the counts of the rows the call wrote, no tenant's",
    ),
    "contextcore_knowledge_followers_not_ready(text)": Definer(
        lambda v: [(DEFAULT_MODEL,), ("test/another-model",)], platform_count
    ),
    "contextcore_knowledge_followers_to_embed(text)": Definer(
        lambda v: [(DEFAULT_MODEL,)], never, why="the owner's alone (00019)"
    ),
    "contextcore_knowledge_source_counts()": Definer(
        lambda v: [()], counts, why="every tenant's sources by status (00014)"
    ),
    "contextcore_knowledge_unindexed_tenants(integer)": Definer(
        lambda v: [("100",), ("1",)], why="a count of tenants; B is small"
    ),
    "contextcore_prune_processed_messages(interval,integer)": Definer(
        lambda v: [("1 microsecond", "1000"), ("-1 year", "1000")],
        why="across tenants by design; B's claim is fresh",
    ),
    "knowledge_record_deletion()": Definer(
        lambda v: [(str(v.source),), (str(v.pending_source),)],
        fire="DELETE FROM public.knowledge_sources WHERE id = $1::text::uuid RETURNING id",
    ),
    WORD_CANDIDATES: Definer(word_candidates),
    WORD_COUNTS: Definer(word_counts),
    "memory_apply(jsonb)": Definer(
        lambda v: [(json.dumps([w]),) for w in memory_writes(v)], refusals
    ),
    "memory_apply(jsonb,boolean)": Definer(
        lambda v: [(json.dumps([w]), wait) for w in memory_writes(v) for wait in ("false", "true")],
        refusals,
    ),
    "memory_apply_one(jsonb)": Definer(
        lambda v: [(json.dumps(w),) for w in memory_writes(v)],
        never,
        why="memory_apply's alone since 00027",
    ),
}


def with_each_null(calls: list[Args]) -> list[Args]:
    """Each call, then each with one argument null in turn."""
    out: list[Args] = []
    for args in calls:
        for variant in [args, *((*args[:i], None, *args[i + 1 :]) for i in range(len(args)))]:
            if variant not in out:
                out.append(variant)
    return out


async def definer_functions(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """Every SECURITY DEFINER function of our schemas (not an extension's): its signature
    and its argument types."""
    rows = await conn.fetch("""
        SELECT p.oid::regprocedure::text AS signature,
               array(SELECT format_type(t, NULL)
                     FROM unnest(p.proargtypes) WITH ORDINALITY AS a (t, i) ORDER BY a.i)
                   AS types
        FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE p.prosecdef
          AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg\\_%'
          AND NOT EXISTS (SELECT FROM pg_depend AS d
                          WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                            AND d.deptype = 'e')
    """)
    return {row["signature"]: list(row["types"]) for row in rows}


def call_sql(signature: str, types: list[str]) -> str:
    name = signature.split("(")[0]
    params = ", ".join(f"${i}::text::{t}" for i, t in enumerate(types, 1))
    return f"SELECT * FROM public.{name}({params})"


def leaks(v: Victim, args: Sequence[object], rows: list[asyncpg.Record]) -> list[str]:
    """B's texts and ids in an answer, but those the caller named itself."""
    named = " ".join(str(a) for a in args)
    answered = repr([list(row.values()) for row in rows])
    return [s for s in v.secrets if s in answered and s not in named]


# ------------------------------------------------------------------------------- the tests


async def test_every_definer_function_of_the_catalog_is_in_the_table(
    admin: asyncpg.Connection,
) -> None:
    """A SECURITY DEFINER function reads as its owner, past the caller's row security: each
    one the migrations create must be called by the test below, which needs its entry."""
    catalog = set(await definer_functions(admin))
    assert catalog - set(DEFINERS) == set(), "add an entry to DEFINERS for each"
    assert set(DEFINERS) - catalog == set(), "no such definer function any more"


@pytest.mark.parametrize("where", [NO_SCOPE, A_SCOPE, PLATFORM_SCOPE, LOGIN])
async def test_no_definer_function_answers_another_organizations_rows(
    where: str, admin: asyncpg.Connection, database: Database, tenant_db: TenantDatabase
) -> None:
    """Each definer function, as the runtime login, from ``where``, aimed at B (and with each
    argument null in turn): refused, or an answer that holds nothing of B's; and B's rows are
    as they were (every answer is committed)."""
    v = await victim(admin)
    before = await rows_of(admin, v.organization)
    functions = await definer_functions(admin)
    problems: list[str] = []
    answered: set[str] = set()
    async with entered(where, tenant_db, database, v) as conn:
        for signature, definer in sorted(DEFINERS.items()):
            sql = definer.fire or call_sql(signature, functions[signature])
            if definer.fire is not None:
                direct = await attempt(conn, f"SELECT public.{signature} IS NULL", [])
                if not isinstance(direct, asyncpg.PostgresError):
                    problems.append(f"{signature} was called directly: {direct}")
            for args in with_each_null(definer.calls(v)):
                result = await attempt(conn, sql, args)
                if isinstance(result, asyncpg.PostgresError):
                    continue
                answered.add(signature)
                if where == LOGIN or not definer.answer(where, result):
                    problems.append(f"{signature}{args} answered {[tuple(r) for r in result]}")
                if found := leaks(v, args, result):
                    problems.append(f"{signature}{args} answered B's {found}")
    assert problems == [], "\n".join(problems)
    if where != LOGIN:  # the calls are well formed: every function that may answer did
        assert {s for s, d in DEFINERS.items() if d.answer not in (never, platform_count)} <= (
            answered
        )
    assert await rows_of(admin, v.organization) == before


async def rls_tables(admin: asyncpg.Connection) -> dict[str, str]:
    """Every table with row security, and its organization column."""
    rows = await admin.fetch("""
        SELECT c.relname,
               CASE WHEN c.relname = 'organizations' THEN 'id' ELSE 'organization_id' END AS col
        FROM pg_class AS c
        WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace AND c.relrowsecurity
        ORDER BY 1
    """)
    return {row["relname"]: row["col"] for row in rows}


async def rows_of(admin: asyncpg.Connection, organization: uuid.UUID) -> dict[str, list[str]]:
    """B's rows in every table with row security, as the administrator reads them. The journal
    rows of the attack's own keys are left out: a write naming B is refused by a journaled
    answer, under B's name, by design."""
    out: dict[str, list[str]] = {}
    for table, col in (await rls_tables(admin)).items():
        rows = await admin.fetch(
            f"SELECT to_jsonb(t)::text AS row, to_jsonb(t) ->> 'idempotency_key' AS key"
            f" FROM {table} AS t WHERE t.{col} = $1",
            organization,
        )
        out[table] = sorted(r["row"] for r in rows if not (r["key"] or "").startswith("attack:"))
    return out


SHARED = {
    "definitions",
    "knowledge_sources",
    "knowledge_source_models",
    "knowledge_chunks",
    "knowledge_settings",
    "organization_quotas",
}
"""The tables whose platform rows (a null organization) every scope reads, by design: platform
definitions and the platform's documentation and live model (docs/tenancy.md), and the default
quotas (00038)."""

SOURCE_TRIGGER = {"knowledge_chunks", "knowledge_source_models"}
"""Their BEFORE INSERT trigger looks the source up first, under the caller's row security
(00007): B's source does not exist for A, and the insert is refused before the policy is."""


async def test_no_scope_sees_or_changes_any_of_another_organizations_rows(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    """Every table with row security: in no scope (and in A's and the platform's), the
    runtime login reads none of B's rows, updates and deletes none, and inserts no copy of
    one; in no scope it reads no organization's row at all, and platform rows only where they
    are shared. B's own scope reads them (so the counts below could see them)."""
    v = await victim(admin)
    tables = await rls_tables(admin)
    copies: dict[str, str] = {}
    for table, col in tables.items():
        copy = await admin.fetchval(
            f"SELECT to_jsonb(t)::text FROM {table} AS t WHERE t.{col} = $1 LIMIT 1",
            v.organization,
        )
        assert copy is not None, f"seed a row of B in {table} (victim())"
        copies[table] = copy
    problems: list[str] = []
    async with tenant_db.writing(v.organization) as tenant:
        for table, col in tables.items():
            seen = await attempt(
                tenant._conn,
                f"SELECT count(*) FROM public.{table} WHERE {col} = $1",
                [v.organization],
            )
            if not isinstance(seen, asyncpg.InsufficientPrivilegeError) and (
                isinstance(seen, asyncpg.PostgresError) or seen[0][0] == 0
            ):
                problems.append(f"B's own scope does not read its {table}: {seen}")
    for where in (NO_SCOPE, A_SCOPE, PLATFORM_SCOPE):
        async with entered(where, tenant_db, database, v) as conn:
            for table, col in tables.items():
                problems += await touches(conn, where, table, col, copies[table], v)
    assert problems == [], "\n".join(problems)


async def touches(
    conn: Connection, where: str, table: str, col: str, copy: str, v: Victim
) -> list[str]:
    """What ``conn`` could do to B's rows of ``table`` (read, update, delete, insert a copy):
    one line for each it did, or for a refusal that is not one."""
    problems = []
    b = [v.organization]
    updatable = await conn.fetchval(
        "SELECT a.attname FROM pg_attribute AS a WHERE a.attrelid = $1::regclass"
        " AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' AND a.attidentity = ''"
        " AND has_column_privilege(a.attrelid, a.attnum, 'UPDATE') ORDER BY a.attnum LIMIT 1",
        f"public.{table}",
    )
    insertable = await conn.fetchval(
        "SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)"
        " FROM pg_attribute AS a WHERE a.attrelid = $1::regclass AND a.attnum > 0"
        " AND NOT a.attisdropped AND a.attgenerated = '' AND a.attidentity = ''",
        f"public.{table}",
    )
    statements = {
        "reads": f"SELECT {col} FROM public.{table} WHERE {col} = $1",
        "updates": f"UPDATE public.{table} SET {updatable or col} = {updatable or col}"
        f" WHERE {col} = $1 RETURNING {col}",
        "deletes": f"DELETE FROM public.{table} WHERE {col} = $1 RETURNING {col}",
    }
    for verb, sql in statements.items():
        result = await attempt(conn, sql, b)
        if isinstance(result, asyncpg.PostgresError):
            if not isinstance(result, asyncpg.InsufficientPrivilegeError):
                problems.append(f"{where} {verb} {table}: {result!r}")
        elif result:
            problems.append(f"{where} {verb} {len(result)} of B's rows of {table}")
    inserted = await attempt(
        conn,
        f"INSERT INTO public.{table} ({insertable}) SELECT {insertable}"
        f" FROM jsonb_populate_record(NULL::public.{table}, $1::jsonb) RETURNING {col}",
        [copy],
    )
    allowed: tuple[type[asyncpg.PostgresError], ...] = (asyncpg.InsufficientPrivilegeError,)
    if table in SOURCE_TRIGGER:
        allowed += (asyncpg.ForeignKeyViolationError,)
    if not isinstance(inserted, allowed):
        problems.append(f"{where} inserts a copy of B's row into {table}: {inserted!r}")
    if where == NO_SCOPE:
        tenant_rows = await attempt(
            conn, f"SELECT count(*) FROM public.{table} WHERE {col} IS NOT NULL", []
        )
        if not isinstance(tenant_rows, asyncpg.InsufficientPrivilegeError) and (
            isinstance(tenant_rows, asyncpg.PostgresError) or tenant_rows[0][0] != 0
        ):
            problems.append(f"no scope reads an organization's rows of {table}: {tenant_rows}")
        platform_rows = await attempt(
            conn, f"SELECT count(*) FROM public.{table} WHERE {col} IS NULL", []
        )
        shared = not isinstance(platform_rows, asyncpg.PostgresError) and platform_rows[0][0] > 0
        if shared != (table in SHARED):
            problems.append(f"no scope reads platform rows of {table}: {shared}")
    return problems


async def test_the_scope_test_answers_true_or_false_never_null(
    admin: asyncpg.Connection, tenant_db: TenantDatabase, database: Database
) -> None:
    """contextcore_in_scope (00035): B's row is out of every scope but B's, and the answer is
    false, not null, so that no NOT or IF around it can take an unknown for a yes."""
    v = await victim(admin)
    expected = {NO_SCOPE: (False, False), A_SCOPE: (False, False), PLATFORM_SCOPE: (False, True)}
    for where, answer in expected.items():
        async with entered(where, tenant_db, database, v) as conn:
            row = await conn.fetchrow(
                "SELECT contextcore_in_scope($1), contextcore_in_scope(NULL)", v.organization
            )
            assert row is not None
            assert (row[0], row[1]) == answer, where
    async with tenant_db.writing(v.organization) as tenant:
        assert await tenant._conn.fetchval("SELECT contextcore_in_scope($1)", v.organization)


async def test_the_calls_reach_the_victims_rows_from_its_own_scope(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """The same calls, from B's own scope, answer B's rows: what they answer elsewhere is
    nothing because of the scope, not because the call could find nothing."""
    v = await victim(admin)
    functions = await definer_functions(admin)
    async with tenant_db.writing(v.organization) as tenant:
        conn = tenant._conn
        counted = call_sql(WORD_COUNTS, functions[WORD_COUNTS])
        assert await conn.fetchval(counted, *word_counts(v)[0]) == [1]
        listed = call_sql(WORD_CANDIDATES, functions[WORD_CANDIDATES])
        found = await conn.fetch(listed, *word_candidates(v)[0])
        assert [r[0] for r in found] == [v.chunk]
        replay = {
            "organization_id": str(v.organization),
            "idempotency_key": v.journal_key,
            "request_sha256": v.journal_digest,
            "operation": "remember",
            "definition_id": str(v.definition),
        }
        answer = await conn.fetchrow(
            "SELECT outcome, replayed, id FROM memory_apply($1::jsonb)", json.dumps([replay])
        )
        assert answer is not None
        assert tuple(answer) == ("created", True, v.memory)


async def test_the_word_reads_refuse_when_the_scope_test_answers_null(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """The word reads' own check holds without the scope test's fix: with
    contextcore_in_scope answering null whatever it is asked (replaced in this test's
    database only, as 00005's did outside any organization), B's words are still refused."""
    v = await victim(admin)
    await admin.execute("""
        CREATE OR REPLACE FUNCTION contextcore_in_scope(row_organization uuid) RETURNS boolean
        LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT NULL::boolean $$""")
    functions = await definer_functions(admin)
    async with tenant_db.writing_each() as conn:
        for signature, calls in ((WORD_COUNTS, word_counts), (WORD_CANDIDATES, word_candidates)):
            for args in calls(v):
                answer = await attempt(conn, call_sql(signature, functions[signature]), args)
                assert isinstance(answer, asyncpg.InsufficientPrivilegeError), (signature, answer)
