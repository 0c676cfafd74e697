"""Per-tenant approximate indexes: how a tenant moves from exact search to HNSW as it grows.

Measured (docs/knowledge.md): an exact scan of one tenant's rows of one model, through the btree
that leads with (organization, model), is fast for a small tenant and grows linearly; one
global HNSW filtered by tenant starves small tenants or needs iterative scans that cost tens of
milliseconds. So a tenant gets a *partial* HNSW index of its own, on its rows of one model, once
it passes ``min_chunks``; until then the exact plan is both fast and exact.

``knowledge_search`` plans each call with the organization and model as literals, so the
planner matches a tenant's partial index when it exists and scans exactly when it does not: no
table of "which tenant uses which plan" to keep in step with the indexes.

Indexes are built by the schema owner (``contextcore-knowledge index``, a dry run unless
``--apply``) with ``CREATE INDEX CONCURRENTLY``: searches and writes go on meanwhile.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from uuid import UUID

import asyncpg

INDEX_PREFIX = "knowledge_chunks_ann_"


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


async def tenant_sizes(conn: asyncpg.Connection) -> list[TenantSize]:
    rows = await conn.fetch(SIZES)
    existing = {
        r["indexname"]
        for r in await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'knowledge_chunks'"
            " AND indexname LIKE $1",
            INDEX_PREFIX + "%",
        )
    }
    return [
        TenantSize(
            r["organization_id"],
            r["embedding_model"],
            r["dimensions"],
            r["chunks"],
            index_name(r["organization_id"], r["embedding_model"]),
            index_name(r["organization_id"], r["embedding_model"]) in existing,
        )
        for r in rows
    ]
