"""The knowledge tables and knowledge_search on real PostgreSQL + pgvector: tenancy, models,
readiness, the sweep and the plan (issue 8; spec "Minimum contract tests")."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg
import numpy as np
import pytest

from contextcore.knowledge.adapters import indexes, store
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.objects import ObjectReader
from contextcore.knowledge.adapters.sandbox import TextSandbox
from contextcore.knowledge.adapters.search import MODEL_MOVED, SEARCH
from contextcore.knowledge.chunk import ChunkSettings, Cut, ModelWindow
from contextcore.knowledge.ingest import Ingestion, Upload
from contextcore.knowledge.state import Accepted, Superseded
from contextcore.storage.tenancy import PLATFORM, TenantDatabase
from tests.services import Config, Database

pytestmark = pytest.mark.integration

ORG_A = uuid.UUID("6f1c2a3b-0000-4000-8000-0000000000a1")
ORG_B = uuid.UUID("6f1c2a3b-0000-4000-8000-0000000000b1")
OTHER_MODEL = "test/other-model"
DIMS = 384


def unit(rng: np.random.Generator, n: int = 1) -> np.ndarray:
    v = rng.standard_normal((n, DIMS)).astype(np.float32)
    normalised: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return normalised


@pytest.fixture
async def tenants(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )
    await admin.execute(
        "INSERT INTO knowledge_models (name, dimensions) VALUES ($1, $2)", OTHER_MODEL, DIMS
    )


async def seed(
    admin: asyncpg.Connection,
    organization: uuid.UUID | None,
    vectors: np.ndarray,
    *,
    model: str = DEFAULT_MODEL,
    status: str = "ready",
    model_status: str = "ready",
    uri: str | None = None,
    texts: list[str] | None = None,
    source_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A source with one chunk per vector, written as the application's superuser."""
    if source_id is None:
        source_id = uuid.uuid4()
        await admin.execute(
            "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
            " status, pending_since, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/plain',"
            " $5, CASE WHEN $5 = 'pending' THEN now() END, 'k')",
            source_id,
            organization,
            f"doc {source_id.hex[:6]}",
            uri or f"docs://{source_id}",
            status,
        )
    count = len(vectors)
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status, pending_since)"
        " VALUES ($1, $2, $3, 1, $4, $5, $6, CASE WHEN $6 = 'pending' THEN now() END)",
        organization,
        source_id,
        model,
        count,
        count if model_status == "ready" else 0,
        model_status,
    )
    await admin.executemany(
        "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation,"
        " ordinal, section, text, tokens, embedding) VALUES ($1, $2, $3, 1, $4, '', $5, 5,"
        " $6::vector)",
        [
            (
                organization,
                source_id,
                model,
                i,
                (texts[i] if texts else f"passage {i} of {source_id.hex[:6]}"),
                store.vector_text(v.tolist()),
            )
            for i, v in enumerate(vectors)
        ],
    )
    return source_id


async def search(
    db: TenantDatabase,
    organization: uuid.UUID,
    vector: np.ndarray,
    *,
    text: str = "",
    platform: bool = False,
    own: bool = True,
    limit: int = 10,
    model: str = DEFAULT_MODEL,
) -> list[asyncpg.Record]:
    async with db.scoped(organization) as tenant:
        return await tenant.fetch(
            SEARCH,
            model,
            store.vector_text(vector.tolist()),
            text,
            platform,
            own,
            limit,
            None,  # chunks, not documents: these tests count chunks
            40,
            0.1,
            0.0,
            200,
        )


async def test_a_second_platform_settings_row_is_refused(
    admin: asyncpg.Connection, tenants: None
) -> None:
    with pytest.raises(asyncpg.UniqueViolationError):
        await admin.execute(
            "INSERT INTO knowledge_settings (organization_id, active_embedding_model)"
            " VALUES (NULL, $1)",
            OTHER_MODEL,
        )
    await admin.execute(
        "INSERT INTO knowledge_settings (organization_id, active_embedding_model) VALUES ($1, $2)",
        ORG_A,
        OTHER_MODEL,
    )
    with pytest.raises(asyncpg.UniqueViolationError):
        await admin.execute(
            "INSERT INTO knowledge_settings (organization_id, active_embedding_model)"
            " VALUES ($1, $2)",
            ORG_A,
            DEFAULT_MODEL,
        )


async def test_a_chunk_organization_can_never_differ_from_its_source(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(1)
    source_a = await seed(admin, ORG_A, unit(rng, 1))
    platform_source = await seed(admin, None, unit(rng, 1))
    insert = (
        "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation,"
        " ordinal, text, tokens, embedding) VALUES ($1, $2, $3, 1, 9, 'x', 1, $4::vector)"
    )
    vector = store.vector_text(unit(rng)[0].tolist())
    for organization, source in [(ORG_B, source_a), (None, source_a), (ORG_A, platform_source)]:
        with pytest.raises(asyncpg.CheckViolationError, match="its source's organization"):
            await admin.execute(insert, organization, source, DEFAULT_MODEL, vector)
    with pytest.raises(asyncpg.CheckViolationError, match="never changes organization"):
        await admin.execute(
            "UPDATE knowledge_sources SET organization_id = $1 WHERE id = $2", ORG_B, source_a
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(
            "UPDATE knowledge_chunks SET organization_id = $1 WHERE source_id = $2",
            ORG_B,
            source_a,
        )
    # the runtime login in B's scope: A's source does not exist for it
    async with tenant_db.writing(ORG_B) as tenant:
        with pytest.raises(asyncpg.ForeignKeyViolationError, match="does not exist in this scope"):
            await tenant._conn.execute(insert, ORG_B, source_a, DEFAULT_MODEL, vector)


async def test_organization_a_never_reads_or_writes_organization_b_knowledge(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 5)
    await seed(admin, ORG_A, vectors)
    source_b = await seed(admin, ORG_B, vectors)  # the same vectors: B's are equally close
    hits = await search(tenant_db, ORG_A, vectors[0])
    assert hits
    assert {h["organization_id"] for h in hits} == {ORG_A}
    async with tenant_db.writing(ORG_A) as tenant:
        conn = tenant._conn
        assert await conn.fetchval("SELECT count(*) FROM knowledge_chunks") == 5
        assert await conn.fetchval("SELECT count(*) FROM knowledge_sources") == 1
        updated = await conn.execute(
            "UPDATE knowledge_sources SET title = 'stolen' WHERE id = $1", source_b
        )
        deleted = await conn.execute("DELETE FROM knowledge_chunks WHERE source_id = $1", source_b)
        assert (updated, deleted) == ("UPDATE 0", "DELETE 0")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # RLS: not in this scope
            await conn.execute(
                "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
                " status, upload_key) VALUES ($1, $2, 'inline', 't', 'u', 'text/plain', 'ready',"
                " 'k')",
                uuid.uuid4(),
                ORG_B,
            )
    # the function's own filter: asking for B's organization from A's scope reads nothing of B
    async with tenant_db.scoped(ORG_A) as tenant:
        rows = await tenant._conn.fetch(
            "SELECT organization_id FROM knowledge_search($1, $3, $2::vector, '', false, true, 10)",
            ORG_B,
            store.vector_text(vectors[0].tolist()),
            DEFAULT_MODEL,
        )
    assert rows == []


async def test_platform_documents_are_reachable_without_weakening_the_tenant_rule(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng, 4)
    await seed(admin, None, vectors[:2])
    await seed(admin, ORG_A, vectors[2:])
    await seed(admin, ORG_B, vectors)
    both = await search(tenant_db, ORG_A, vectors[0], platform=True, own=True)
    assert {h["organization_id"] for h in both} == {None, ORG_A}
    only_platform = await search(tenant_db, ORG_A, vectors[0], platform=True, own=False)
    assert {h["organization_id"] for h in only_platform} == {None}
    only_own = await search(tenant_db, ORG_A, vectors[0], platform=False, own=True)
    assert {h["organization_id"] for h in only_own} == {ORG_A}
    assert await search(tenant_db, ORG_A, vectors[0], platform=False, own=False) == []
    # platform rows are written only in the platform's scope, never in an organization's
    async with tenant_db.writing(ORG_A) as tenant:
        assert (
            await tenant._conn.execute(
                "UPDATE knowledge_sources SET title = 'x' WHERE organization_id IS NULL"
            )
            == "UPDATE 0"
        )
    async with tenant_db.writing(PLATFORM) as tenant:
        assert (
            await tenant._conn.fetchval(
                "SELECT count(*) FROM knowledge_sources WHERE organization_id IS NOT NULL"
            )
            == 0
        )


async def test_a_query_never_mixes_two_models_also_in_the_middle_of_a_switch(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(4)
    vectors = unit(rng, 6)
    source = await seed(admin, ORG_A, vectors, texts=[f"old {i}" for i in range(6)])
    # step 1 of a switch: the same source embedded under the new model too
    await seed(
        admin,
        ORG_A,
        vectors,
        model=OTHER_MODEL,
        source_id=source,
        texts=[f"new {i}" for i in range(6)],
    )
    before = await search(tenant_db, ORG_A, vectors[0])
    assert len(before) == 6
    assert all(h["text"].startswith("old") for h in before)
    assert {h["embedding_model"] for h in before} == {DEFAULT_MODEL}
    await admin.execute(  # step 3: the flip, one row
        "INSERT INTO knowledge_settings (organization_id, active_embedding_model) VALUES ($1, $2)",
        ORG_A,
        OTHER_MODEL,
    )
    after = await search(tenant_db, ORG_A, vectors[0], model=OTHER_MODEL)
    assert len(after) == 6
    assert all(h["text"].startswith("new") for h in after)
    # a query embedded by the model that was live before the flip is refused, not answered
    # with the other model's chunks (the caller reads the live model again: search.py)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await search(tenant_db, ORG_A, vectors[0])
    assert refused.value.sqlstate == MODEL_MOVED
    # B still searches the platform's model
    assert await search(tenant_db, ORG_B, vectors[0]) == []


async def test_only_ready_sources_and_complete_models_are_searched(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(5)
    vectors = unit(rng, 3)
    await seed(admin, ORG_A, vectors[:1], status="pending")
    await seed(admin, ORG_A, vectors[1:2], model_status="pending")
    ready = await seed(admin, ORG_A, vectors[2:])
    hits = await search(tenant_db, ORG_A, vectors[0], limit=10)
    assert [h["source_id"] for h in hits] == [ready]


async def test_the_sweep_fails_a_source_pending_over_an_hour_with_the_reason(
    admin: asyncpg.Connection, tenants: None, database: Database
) -> None:
    rng = np.random.default_rng(6)
    stale = await seed(admin, ORG_A, unit(rng, 2), status="pending", model_status="pending")
    fresh = await seed(admin, ORG_B, unit(rng, 2), status="pending", model_status="pending")
    await admin.execute(
        "UPDATE knowledge_source_models SET chunks_stored = 1, pending_since = now() - interval"
        " '61 minutes' WHERE source_id = $1",
        stale,
    )
    await admin.execute(
        "UPDATE knowledge_sources SET pending_since = now() - interval '61 minutes',"
        " reply_to = 'replies', correlation_id = 'c-9' WHERE id = $1",
        stale,
    )
    await admin.execute(
        "UPDATE knowledge_sources SET pending_since = now() - interval '30 minutes' WHERE id = $1",
        fresh,
    )
    conn = await asyncpg.connect(database.url)  # the runtime login
    try:
        # the database's floor: a caller cannot fail a source pending for less than an hour
        swept = await store.sweep(conn, older_than=timedelta(seconds=1), batch=10)
    finally:
        await conn.close()
    assert [(s.source_id, s.organization_id) for s in swept] == [(stale, ORG_A)]
    assert swept[0].reply_to == "replies"
    assert swept[0].correlation_id == "c-9"
    assert "pending for more than an hour" in swept[0].reason
    assert f"1 of 2 chunks stored under {DEFAULT_MODEL}" in swept[0].reason
    rows = await admin.fetch(
        "SELECT id, status, status_reason FROM knowledge_sources ORDER BY status"
    )
    states = {r["id"]: (r["status"], r["status_reason"]) for r in rows}
    assert states[stale][0] == "failed"
    assert "1 of 2 chunks" in states[stale][1]
    assert states[fresh] == ("pending", None)


async def test_an_object_backed_source_has_the_uri_boundary(
    tenants: None, tenant_db: TenantDatabase
) -> None:
    identities: list[Any] = []
    for scope in (ORG_A, ORG_A, ORG_B, PLATFORM, PLATFORM):
        async with tenant_db.writing(scope) as tenant:
            identities.append(
                await store.accept(
                    tenant,
                    source_id=uuid.uuid4(),
                    kind="s3",
                    title="t",
                    uri=None,
                    object_key="bucket/shared/key.pdf",
                    media_type="application/pdf",
                    reply_to=None,
                    correlation_id=None,
                    upload_key="k",
                )
            )
    (a1, g1), (a2, g2), (b, _), (p1, pg1), (p2, pg2) = [
        (accepted.source_id, accepted.generation) for accepted in identities
    ]
    assert (a2, g1, g2) == (a1, 1, 2), "the same (organization, object key) is one source"
    assert (p2, pg1, pg2) == (p1, 1, 2), "the platform has the same boundary"
    assert len({a1, b, p1}) == 3


async def test_a_generation_replaced_while_pending_names_its_uploader(
    tenants: None, tenant_db: TenantDatabase, admin: asyncpg.Connection
) -> None:
    """Issue 17, item 5: the accept (or a retry's restart) that replaces a pending generation
    returns that generation's uploader, whose address the row forgets; one that replaces a
    finished generation, or answers the same address, returns nobody."""

    async def accept(key: str, reply_to: str, correlation_id: str) -> Accepted:
        async with tenant_db.writing(ORG_A) as tenant:
            return await store.accept(
                tenant,
                source_id=uuid.uuid4(),
                kind="inline",
                title="t",
                uri="docs://same",
                object_key=None,
                media_type="text/plain",
                reply_to=reply_to,
                correlation_id=correlation_id,
                upload_key=key,
            )

    first = await accept("k1", "r.one", "c1")
    assert (first.generation, first.replaced) == (1, None)
    second = await accept("k2", "r.two", "c2")
    assert second.replaced == Superseded(first.source_id, 2, 1, "r.one", "c1")
    assert (await accept("k3", "r.two", "c2")).replaced is None, "the same address"
    async with tenant_db.writing(ORG_A) as tenant:
        assert await store.record_failure(tenant, first.source_id, 3, "broken")
    assert (await accept("k4", "r.four", "c4")).replaced is None, "it was told it failed"
    await admin.execute(  # the stored text a retry starts from
        "UPDATE knowledge_sources SET sections = '[]' WHERE id = $1", first.source_id
    )
    async with tenant_db.writing(ORG_A) as tenant:
        retried = await store.restart_generation(tenant, first.source_id, "k5", "r.five", "c5")
    assert retried is not None
    assert retried.replaced == Superseded(first.source_id, 5, 4, "r.four", "c4")


class Interrupted(TextSandbox):
    """Runs ``meanwhile`` once, while the first document is being extracted."""

    def __init__(self, meanwhile: Any) -> None:
        super().__init__(workers=1)
        self.meanwhile = meanwhile

    async def cut(self, **job: Any) -> Cut:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            await meanwhile()
        return await super().cut(**job)


@pytest.mark.parametrize("text", ["# Guide\n\nRefunds within 30 days.\n", " \n"])
async def test_an_upload_replaced_while_it_was_extracted_is_answered_superseded(
    tenants: None, tenant_db: TenantDatabase, text: str
) -> None:
    """Issue 17, item 5: the later upload's accept commits while the first upload's document
    is in the sandbox. Whatever the extraction gives (chunks, or a reason to fail), the first
    upload's steps change nothing, it publishes no batch, and its answer is ``superseded``,
    never the later upload's ``pending``."""
    later: list[Accepted] = []

    async def accept_a_later_upload() -> None:
        async with tenant_db.writing(ORG_A) as tenant:
            later.append(
                await store.accept(
                    tenant,
                    source_id=uuid.uuid4(),
                    kind="inline",
                    title="Guide",
                    uri="docs://guide",
                    object_key=None,
                    media_type="text/markdown",
                    reply_to="r.later",
                    correlation_id="c-later",
                    upload_key="k-later",
                )
            )

    window = ModelWindow(default_model_path(DEFAULT_MODEL), ChunkSettings())
    sandbox = Interrupted(accept_a_later_upload)
    told: list[Superseded] = []

    async def tell(replaced: Superseded) -> None:
        told.append(replaced)

    ingestion = Ingestion(
        store.PostgresKnowledgeRepository(tenant_db),
        ObjectReader(max_bytes=1_000_000),
        sandbox,
        {DEFAULT_MODEL: window}.get,
    )
    try:
        prepared = await ingestion.prepare(
            Upload(
                organization_id=ORG_A,
                title="Guide",
                media_type="text/markdown",
                upload_key="k-first",
                uri="docs://guide",
                text=text,
                reply_to="r.first",
                correlation_id="c-first",
            ),
            replaced=tell,
        )
    finally:
        await sandbox.close()
    [accepted] = later
    assert told == []  # the first upload replaced nobody
    assert accepted.replaced == Superseded(
        accepted.source_id, 2, 1, "r.first", "c-first"
    )  # the later one tells the first uploader, and so does the first upload's own answer:
    assert prepared.superseded == Superseded(accepted.source_id, 2, 1)
    assert prepared.batches == []
    assert (prepared.source.generation, prepared.source.status) == (2, "pending")
    assert prepared.source.sections is None, "the replaced generation recorded no text"


async def test_the_plan_is_exact_for_a_small_tenant_and_hnsw_for_an_indexed_one(
    admin: asyncpg.Connection, tenants: None, database: Database
) -> None:
    rng = np.random.default_rng(7)
    small = unit(rng, 50)
    # past the index threshold (docs/knowledge.md); clustered, as real embeddings are (uniform
    # random vectors in 384 dimensions have no neighbourhoods for a graph index to follow)
    centres = unit(rng, 200)
    large = centres[rng.integers(0, 200, 10_000)] + 0.35 * unit(rng, 10_000)
    large /= np.linalg.norm(large, axis=1, keepdims=True)
    await seed(admin, ORG_A, small)
    await seed(admin, ORG_B, large)
    await admin.execute(indexes.create_sql(ORG_B, DEFAULT_MODEL, DIMS))
    await admin.execute("ANALYZE knowledge_chunks")
    plans = {
        organization: await _plan(admin, organization, query)
        for organization, query in [(ORG_A, small[0]), (ORG_B, large[0])]
    }
    assert indexes.index_name(ORG_B, DEFAULT_MODEL) in plans[ORG_B]
    assert "knowledge_chunks_ann_" not in plans[ORG_A]
    assert "knowledge_chunks_scope_idx" in plans[ORG_A]
    # recall of the approximate plan against exact search, under the tenant filter
    ids = {
        r["ordinal"]: r["id"]
        for r in await admin.fetch(
            "SELECT ordinal, id FROM knowledge_chunks WHERE organization_id = $1", ORG_B
        )
    }
    queries = large[rng.choice(len(large), 30, replace=False)] + 0.35 * unit(rng, 30)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    found = 0
    pool = await asyncpg.create_pool(database.url, min_size=1, max_size=1)
    try:
        db = TenantDatabase(pool)
        for query in queries:
            exact = {ids[int(i)] for i in np.argsort(-(large @ query))[:10]}
            approximate = {h["chunk_id"] for h in await search(db, ORG_B, query, limit=10)}
            found += len(exact & approximate)
    finally:
        await pool.close()
    assert found / (10 * len(queries)) >= 0.95


async def _plan(admin: asyncpg.Connection, organization: uuid.UUID, vector: np.ndarray) -> str:
    """The plans knowledge_search ran, reported by auto_explain (nested statements)."""
    notices: list[str] = []

    def listen(_conn: Any, message: Any) -> None:
        notices.append(str(message.message))

    admin.add_log_listener(listen)
    async with admin.transaction():
        await admin.execute("LOAD 'auto_explain'")
        await admin.execute(
            "SET LOCAL auto_explain.log_min_duration = 0;"
            " SET LOCAL auto_explain.log_nested_statements = on;"
            " SET LOCAL auto_explain.log_level = notice"
        )
        await admin.execute(
            "SELECT set_config('contextcore.organization_id', $1, true),"
            " set_config('role', 'contextcore_app', true)",
            str(organization),
        )
        await admin.fetch(
            "SELECT * FROM knowledge_search($1, $3, $2::vector, '', false, true, 10)",
            organization,
            store.vector_text(vector.tolist()),
            DEFAULT_MODEL,
        )
    await asyncio.sleep(0.2)  # asyncpg hands notices to listeners on later loop iterations
    admin.remove_log_listener(listen)
    return "\n".join(notices)


async def test_the_sweep_service_tells_the_uploader_why_its_source_failed(
    admin: asyncpg.Connection, tenants: None, database: Database, config: Config
) -> None:
    from broker.reply_topics import ReplyTopics
    from consumers.knowledge.sweep.app import Sweeper, SweepSettings
    from consumers.knowledge.sweep.postgres import PostgresSweepStore
    from consumers.runtime.kafka import AiokafkaPublisher
    from contextcore.storage.settings import DatabaseSettings
    from tests.integration.helpers import read_json

    rng = np.random.default_rng(9)
    stale = await seed(admin, ORG_A, unit(rng, 2), status="pending", model_status="pending")
    reply_to = config.reply_topic("swept")
    await admin.execute(
        "UPDATE knowledge_sources SET pending_since = now() - interval '2 hours', reply_to = $2,"
        " correlation_id = 'upload-7' WHERE id = $1",
        stale,
        reply_to,
    )
    await admin.execute(
        "UPDATE knowledge_source_models SET pending_since = now() - interval '2 hours'"
        " WHERE source_id = $1",
        stale,
    )
    publisher = AiokafkaPublisher(config.kafka, client_id="test-sweep")
    await publisher.start()
    try:
        from broker.topics import TopicSpec, ensure_topics

        await ensure_topics(config.bootstrap, [TopicSpec(reply_to, 1)])
        sweeper = Sweeper(
            SweepSettings(metrics_port=0),
            PostgresSweepStore(DatabaseSettings.model_construct(url=database.url)),
            publisher,
            reply_topics=ReplyTopics.of(config.topics),  # this test's reply prefix
        )
        swept = await sweeper.sweep_once()
        assert [s.source_id for s in swept] == [stale]
        assert await sweeper.sweep_once() == [], "a failed source is not swept twice"
    finally:
        await publisher.stop()
    [reply] = await read_json(config.bootstrap, reply_to, until=1)
    assert reply["correlation_id"] == "upload-7"
    assert reply["status"] == "failed"
    assert "0 of 2 chunks stored" in reply["reason"]
    assert sweeper.registry.get_sample_value("contextcore_knowledge_sources_swept_total") == 1
    # counted after the sweep: every tenant's sources by status, no id
    sample = sweeper.registry.get_sample_value
    assert sample("contextcore_knowledge_sources", {"status": "failed"}) == 1
    assert sample("contextcore_knowledge_sources", {"status": "pending"}) == 0
    assert sample("contextcore_knowledge_oldest_pending_seconds") == 0


async def test_the_source_counts_span_tenants_and_name_no_row(
    admin: asyncpg.Connection, tenants: None, database: Database
) -> None:
    rng = np.random.default_rng(10)
    waiting = await seed(admin, ORG_A, unit(rng, 2), status="pending", model_status="pending")
    await seed(admin, ORG_B, unit(rng, 2), status="ready", model_status="ready")
    await seed(admin, ORG_B, unit(rng, 2), status="ready", model_status="ready")
    await admin.execute(
        "UPDATE knowledge_sources SET pending_since = now() - interval '20 minutes' WHERE id = $1",
        waiting,
    )
    conn = await asyncpg.connect(database.url)  # the runtime login
    try:
        counts = await store.source_counts(conn)
        # outside the function the runtime login, before it takes the service role, does not
        # even see the schema (no USAGE), let alone a source of any tenant
        with pytest.raises(asyncpg.UndefinedTableError):
            await conn.fetchval("SELECT count(*) FROM knowledge_sources")
    finally:
        await conn.close()
    assert counts.by_status == {"pending": 1, "ready": 2, "failed": 0}
    assert counts.oldest_pending_seconds is not None
    assert 1190 < counts.oldest_pending_seconds < 1300


async def test_a_search_changes_no_setting_of_the_caller_transaction(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    rng = np.random.default_rng(10)
    vectors = unit(rng, 3)
    await seed(admin, ORG_A, vectors)
    async with tenant_db.scoped(ORG_A) as tenant:
        before = await tenant._conn.fetchrow(
            "SELECT current_setting('enable_sort') AS sort,"
            " current_setting('hnsw.ef_search', true) AS ef"
        )
        hits = await tenant.fetch(
            SEARCH,
            DEFAULT_MODEL,
            store.vector_text(vectors[0].tolist()),
            "x",
            False,
            True,
            5,
            None,
            40,
            0.2,
            0.0,
            300,
        )
        after = await tenant._conn.fetchrow(
            "SELECT current_setting('enable_sort') AS sort,"
            " current_setting('hnsw.ef_search', true) AS ef"
        )
    assert len(hits) == 3
    assert before is not None
    assert after is not None
    assert (after["sort"], after["ef"]) == ("on", before["ef"] or "40")


@asynccontextmanager
async def owner_connection(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A session of the schema owner, closed on exit."""
    conn = await asyncpg.connect(database.owner_url)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def refused(conn: Any, error: type[Exception]) -> AsyncIterator[None]:
    """The statement inside raises ``error``; a savepoint keeps the scope's transaction."""
    await conn.execute("SAVEPOINT refused")
    with pytest.raises(error):
        yield
    await conn.execute("ROLLBACK TO SAVEPOINT refused")


async def test_the_word_reads_of_the_search_answer_only_the_callers_scope(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    """Issue 18: the full-text side reads as the owner (the GIN index is of no use under the
    caller's row security), so its two functions check the scope themselves: from A's scope,
    B's chunks are neither counted nor returned, and the search finds B's words nowhere."""
    rng = np.random.default_rng(21)
    await seed(admin, ORG_A, unit(rng, 2), texts=["alpha refunds", "alpha invoices"])
    await seed(admin, ORG_B, unit(rng, 2), texts=["bravo secret merger", "bravo merger plan"])
    await seed(admin, None, unit(rng, 1), texts=["platform merger guide"])
    words = "ARRAY['merger'::tsquery, 'alpha'::tsquery]"
    async with tenant_db.scoped(ORG_A) as tenant:
        conn = tenant._conn
        own = await conn.fetchval(
            f"SELECT knowledge_word_counts($1, true, true, $2, {words})", ORG_A, DEFAULT_MODEL
        )
        assert own == [1, 2], "A's and the platform's chunks with each word"
        for call in (
            f"SELECT knowledge_word_counts($1, false, true, $2, {words})",
            "SELECT count(*) FROM knowledge_word_candidates($1, false, true, $2,"
            " 'merger'::tsquery, ARRAY['merger'::tsquery], ARRAY[1.0::float8], '{}', 10)",
        ):
            async with refused(conn, asyncpg.InsufficientPrivilegeError):
                await conn.fetchval(call, ORG_B, DEFAULT_MODEL)
        found = await tenant.fetch(
            SEARCH,
            DEFAULT_MODEL,
            store.vector_text(unit(rng)[0].tolist()),
            "merger",
            True,
            True,
            10,
            None,
            40,
            1.0,
            0.0,
            200,
        )
    assert {r["text"] for r in found if r["lexical"] > 0} == {"platform merger guide"}
    assert all(r["organization_id"] in (ORG_A, None) for r in found)


async def test_words_weigh_by_how_well_they_tell_the_chunks_apart(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    """Issue 18, migration 00022: the lexical weight scales with the question's rarest word.
    A word every chunk has barely weighs, however often one chunk repeats it (00017's full
    weight let "python python python" overtake the nearest chunk); a word one chunk alone has
    weighs fully and lifts that chunk over a slightly nearer one."""
    basis = np.eye(DIMS, dtype=np.float32)
    query = basis[0]
    nearest = 0.60 * basis[0] + 0.80 * basis[1]
    repeats = 0.595 * basis[0] + np.sqrt(1 - 0.595**2) * basis[2]
    others = basis[3:21]  # orthogonal to the query
    await seed(admin, ORG_A, nearest[None], texts=["python guide to lists"])
    await seed(admin, ORG_A, repeats[None], texts=["python python python python fetchmail"])
    await seed(admin, ORG_A, others, texts=[f"python note {i}" for i in range(len(others))])

    async def first(text: str) -> str:
        async with tenant_db.scoped(ORG_A) as tenant:
            rows = await tenant.fetch(
                SEARCH, DEFAULT_MODEL, store.vector_text(query.tolist()), text,
                False, True, 3, 1, 40, 0.4, 0.0, 200,
            )  # fmt: skip
        assert [r["document_rank"] for r in rows] == [1, 2, 3]
        text_of_first: str = rows[0]["text"]
        return text_of_first

    assert await first("") == "python guide to lists", "the vectors alone"
    assert await first("python") == "python guide to lists", "a word every chunk has"
    assert await first("python fetchmail") == "python python python python fetchmail"


async def test_deletion_records_are_append_only_and_tenant_scoped(
    admin: asyncpg.Connection, tenants: None, tenant_db: TenantDatabase
) -> None:
    from contextcore.knowledge.adapters import admin as steps

    rng = np.random.default_rng(22)
    theirs = await seed(admin, ORG_B, unit(rng, 1))
    async with tenant_db.writing(ORG_B) as tenant:
        gone = await steps.delete_document(tenant, theirs, requested_by="b-admin")
    assert gone is not None
    async with tenant_db.writing(ORG_A) as tenant:
        conn = tenant._conn
        assert await conn.fetchval("SELECT count(*) FROM knowledge_deletions") == 0
        assert await steps.deletions(tenant) == []
        for statement in (
            "UPDATE knowledge_deletions SET title = 'x'",
            "DELETE FROM knowledge_deletions",
        ):
            async with refused(conn, asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
        for organization in (ORG_B, ORG_A):  # no record is written but by the trigger
            async with refused(conn, asyncpg.InsufficientPrivilegeError):
                await conn.execute(
                    "INSERT INTO knowledge_deletions (organization_id, source_id, title,"
                    " identity, chunks) VALUES ($1, $2, 'forged', 'docs://x', 0)",
                    organization,
                    uuid.uuid4(),
                )
        # a delete by any path is recorded (migration 00021), who asked being unknown
        mine = await seed(admin, ORG_A, unit(rng, 2))
        await conn.execute("DELETE FROM knowledge_sources WHERE id = $1", mine)
        [plain] = await steps.deletions(tenant)
        assert (plain.source_id, plain.chunks, plain.requested_by) == (mine, 2, None)
        # the platform's switch's count across tenants is the platform's alone (00021)
        async with refused(conn, asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT contextcore_knowledge_followers_not_ready($1)", "m")
    async with tenant_db.writing(ORG_B) as tenant:
        [record] = await steps.deletions(tenant)
    assert (record.source_id, record.requested_by) == (theirs, "b-admin")
    assert record.login != "postgres", "the login is the session's, not what a caller says"


async def test_a_tenant_past_the_threshold_gets_its_index_without_an_operator(
    admin: asyncpg.Connection, tenants: None, database: Database, config: Config
) -> None:
    """Issue 18: the indexer job builds the index of a tenant that crossed the threshold (and
    rebuilds one a failed concurrent build left invalid), keeps it while the tenant stays above
    half the threshold and drops it below; the sweep's gauge counts the tenants still without
    one, by the index's name as indexes.index_name gives it."""
    from consumers.knowledge.sweep.app import Sweeper, SweepSettings
    from consumers.knowledge.sweep.postgres import PostgresSweepStore
    from contextcore.storage.settings import DatabaseSettings
    from tests.integration.test_knowledge_admin import command

    rng = np.random.default_rng(23)
    larger = await seed(admin, ORG_A, unit(rng, 70))
    middle = await seed(admin, ORG_A, unit(rng, 30))
    await seed(admin, ORG_A, unit(rng, 20))
    await seed(admin, ORG_B, unit(rng, 2))  # below the threshold: the exact scan is enough
    sweeper = Sweeper(
        SweepSettings(metrics_port=0, index_min_chunks=100),
        PostgresSweepStore(DatabaseSettings.model_construct(url=database.url)),
        publisher=None,  # type: ignore[arg-type]  # nothing pending: nobody is told anything
    )

    async def unindexed() -> float | None:
        await sweeper.sweep_once()
        return sweeper.registry.get_sample_value("contextcore_knowledge_tenants_without_index")

    assert await unindexed() == 1
    owner = config.with_("database", owner_url=database.owner_url)
    code, out = await command(owner, "index", "--min-chunks", "100")
    assert (code, "to index" in out, "dry run" in out) == (0, True, True), out
    assert await unindexed() == 1
    code, out = await command(owner, "index", "--min-chunks", "100", "--apply")
    assert code == 0, out
    name = indexes.index_name(ORG_A, DEFAULT_MODEL)
    assert f"built {name}" in out
    assert await unindexed() == 0
    # as a CREATE INDEX CONCURRENTLY that failed half way leaves it
    await admin.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass", name
    )
    assert await unindexed() == 1
    code, out = await command(owner, "index", "--min-chunks", "100", "--apply")
    assert (code, f"built {name}" in out) == (0, True), out
    assert await admin.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = $1::regclass", name
    )
    assert await unindexed() == 0
    exists = "SELECT count(*) FROM pg_indexes WHERE indexname = $1"
    await admin.execute("DELETE FROM knowledge_sources WHERE id = $1", larger)
    code, out = await command(owner, "index", "--min-chunks", "100", "--apply")
    assert (code, "dropped" in out, await admin.fetchval(exists, name)) == (0, False, 1), out
    # 20 chunks left, under half the threshold; and an index of a tenant that is gone
    await admin.execute("DELETE FROM knowledge_sources WHERE id = $1", middle)
    gone = uuid.uuid4()
    async with owner_connection(database) as conn:
        await conn.execute(indexes.create_sql(gone, DEFAULT_MODEL, DIMS))
    stale = {name, indexes.index_name(gone, DEFAULT_MODEL)}
    code, out = await command(owner, "index", "--min-chunks", "100")
    assert {n for n in stale if f"{n}  to drop" in out} == stale, out
    async with owner_connection(database) as conn:  # another pass holds the lock: none runs
        assert await indexes.take_pass_lock(conn)
        code, out = await command(owner, "index", "--min-chunks", "100", "--apply")
        assert "another index pass is running" in out, out
    assert [await admin.fetchval(exists, n) for n in sorted(stale)] == [1, 1]
    code, out = await command(owner, "index", "--min-chunks", "100", "--apply")
    assert {n for n in stale if f"dropped {n}" in out} == stale, out
    assert [await admin.fetchval(exists, n) for n in sorted(stale)] == [0, 0]


async def test_the_indexer_job_builds_as_tenants_grow_and_stops_on_sigterm(
    admin: asyncpg.Connection, tenants: None, database: Database, config: Config
) -> None:
    import signal
    import sys

    owner = config.with_("database", owner_url=database.owner_url)
    job = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "admin.knowledge",
        "index",
        "--apply",
        "--every",
        "0.2",
        "--min-chunks",
        "3",
        env=owner.environ(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        name = indexes.index_name(ORG_A, DEFAULT_MODEL)
        exists = "SELECT count(*) FROM pg_indexes WHERE indexname = $1"
        await seed(admin, ORG_A, unit(np.random.default_rng(24), 2))
        await asyncio.sleep(1.0)  # passes run; 2 chunks are below the threshold
        assert await admin.fetchval(exists, name) == 0
        await seed(admin, ORG_A, unit(np.random.default_rng(25), 2))  # the tenant grows
        async with asyncio.timeout(60):
            while True:
                if await admin.fetchval(exists, name) == 1:
                    break
                await asyncio.sleep(0.2)
    finally:
        job.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(job.communicate(), 60)
    assert job.returncode == 0, out.decode()
    assert f"built {name}" in out.decode()
