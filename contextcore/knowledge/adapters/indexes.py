"""Per-tenant approximate indexes: how a tenant moves from exact search to HNSW as it grows.

Measured (docs/knowledge.md): an exact scan of one tenant's rows of one model, through the btree
that leads with (organization, model), is fast for a small tenant and grows linearly; one
global HNSW filtered by tenant starves small tenants or needs iterative scans that cost tens of
milliseconds. So a tenant gets a *partial* HNSW index of its own, on its rows of one model, once
it passes ``min_chunks``; until then the exact plan is both fast and exact.

``knowledge_search`` plans each call with the organization and model as literals, so the
planner matches a tenant's partial index when it exists and scans exactly when it does not: no
table of "which tenant uses which plan" to keep in step with the indexes.

Indexes are built by the schema owner with ``CREATE INDEX CONCURRENTLY`` (searches and writes go
on meanwhile): ``contextcore knowledge index --apply --every N``, a job of its own (docker-compose's
``knowledge-indexer``, k8s's CronJob), so a tenant gets its index when it crosses the threshold
without an operator, and loses it when it leaves or shrinks below half the threshold. The
sweep's gauge ``contextcore_knowledge_tenants_without_index`` shows the tenants still waiting
for one (migration 00020).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from contextcore.storage.tenancy import Connection

INDEX_PREFIX = "knowledge_chunks_ann_"
MIN_CHUNKS = 2_000
"""A tenant of this many chunks of one model gets its own HNSW index (docs/performance.md:
below it the exact scan is as fast)."""


@dataclass(frozen=True)
class TenantSize:
    organization_id: UUID | None
    model: str
    dimensions: int
    chunks: int
    index: str
    indexed: bool


def index_name(organization_id: UUID | None, model: str) -> str:
    tenant = "platform" if organization_id is None else str(organization_id)
    return INDEX_PREFIX + hashlib.sha256(f"{tenant}|{model}".encode()).hexdigest()[:20]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_sql(organization_id: UUID | None, model: str, dimensions: int) -> str:
    """The statement that builds one tenant's partial HNSW index (cosine, the model's dims)."""
    if organization_id is None:
        tenant = "organization_id IS NULL"
    else:
        tenant = f"organization_id = {_literal(str(UUID(str(organization_id))))}::uuid"
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index_name(organization_id, model)} "
        f"ON knowledge_chunks USING hnsw ((embedding::vector({int(dimensions)})) "
        f"vector_cosine_ops) WHERE {tenant} AND embedding_model = {_literal(model)}"
    )


SIZES = """
-- knowledge.tenant_sizes: chunks per tenant and model (the current generation of every source
-- not failed), from the per-model rows, which the owner reads (migration 00007).
SELECT m.organization_id, m.embedding_model, km.dimensions, sum(m.chunk_count)::bigint AS chunks
FROM knowledge_source_models m JOIN knowledge_models km ON km.name = m.embedding_model
WHERE m.status <> 'failed'
GROUP BY m.organization_id, m.embedding_model, km.dimensions
ORDER BY chunks DESC
"""


_INDEXES_SQL = """
-- knowledge.tenant_indexes: the per-tenant indexes there are, and whether each is valid (a
-- CREATE INDEX CONCURRENTLY that failed leaves an invalid one behind)
SELECT c.relname AS name, i.indisvalid AS valid
FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE $1
"""

_UNINDEXED_SQL = """
-- knowledge.unindexed_tenants: tenants at or past the threshold without a valid index of their
-- own, counted by the owner's SECURITY DEFINER function (migration 00020)
SELECT contextcore_knowledge_unindexed_tenants($1)
"""


async def tenant_sizes(conn: asyncpg.Connection) -> list[TenantSize]:
    """As the schema owner: every tenant's size, and whether it has a valid index."""
    rows = await conn.fetch(SIZES)
    valid = {r["name"]: r["valid"] for r in await conn.fetch(_INDEXES_SQL, INDEX_PREFIX + "%")}
    return [
        TenantSize(
            r["organization_id"],
            r["embedding_model"],
            r["dimensions"],
            r["chunks"],
            index_name(r["organization_id"], r["embedding_model"]),
            valid.get(index_name(r["organization_id"], r["embedding_model"]), False),
        )
        for r in rows
    ]


async def build_missing(
    conn: asyncpg.Connection, sizes: list[TenantSize], min_chunks: int = MIN_CHUNKS
) -> list[TenantSize]:
    """As the schema owner: build the index of every tenant of ``sizes`` (:func:`tenant_sizes`)
    of ``min_chunks`` or more that has no valid one (an invalid one is dropped first),
    concurrently, one at a time; returns the tenants it built. Searches and writes go on
    meanwhile."""
    built = []
    for size in sizes:
        if size.indexed or size.chunks < min_chunks:
            continue
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {size.index}")
        await conn.execute(create_sql(size.organization_id, size.model, size.dimensions))
        built.append(size)
    return built


async def unneeded(
    conn: asyncpg.Connection, sizes: list[TenantSize], min_chunks: int = MIN_CHUNKS
) -> list[str]:
    """As the schema owner: the per-tenant indexes whose tenant is gone or has shrunk below
    half of ``min_chunks`` (half, so a tenant hovering at the threshold is not built and dropped
    pass after pass). ``sizes``: :func:`tenant_sizes` of the same pass."""
    kept = {size.index for size in sizes if size.chunks >= min_chunks // 2}
    return [
        row["name"]
        for row in await conn.fetch(_INDEXES_SQL, INDEX_PREFIX + "%")
        # LIKE's "_" matches any character: only a name index_name() gives is ours
        if row["name"] not in kept and _OURS.fullmatch(row["name"])
    ]


async def drop_unneeded(
    conn: asyncpg.Connection, sizes: list[TenantSize], min_chunks: int = MIN_CHUNKS
) -> list[str]:
    """As the schema owner: drop the :func:`unneeded` indexes, concurrently; returns their
    names."""
    dropped = await unneeded(conn, sizes, min_chunks)
    for name in dropped:
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    return dropped


PASS_LOCK = 0x636F6E74_6978  # "contix": one index pass at a time, of any process
"""The advisory lock an applying pass holds, so a manual ``index --apply`` and the job (or two
jobs) never build and drop at once on sizes read apart."""


async def take_pass_lock(conn: asyncpg.Connection) -> bool:
    """Hold :data:`PASS_LOCK` for the connection's session; ``False`` when another pass has it
    (the caller skips its pass)."""
    taken: bool = await conn.fetchval("SELECT pg_try_advisory_lock($1)", PASS_LOCK)
    return taken


_OURS = re.compile(re.escape(INDEX_PREFIX) + "[0-9a-f]{20}")


async def unindexed_tenants(conn: Connection, min_chunks: int = MIN_CHUNKS) -> int:
    """How many tenants of ``min_chunks`` or more have no valid index (any login that may take
    the service role: a count, no organization)."""
    count: int = await conn.fetchval(_UNINDEXED_SQL, min_chunks)
    return count
