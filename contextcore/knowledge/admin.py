"""What the admin commands read and change (``contextcore-knowledge``), in one scope at a time.

The model switch, in the spec's four steps, each refusing to run out of order:

1. ``prepare``: the scope's ``next_embedding_model`` is set (the model registered with its
   dimensions); every source is then embedded under it too (the command asks the upload
   consumer), while the live model's chunks keep serving; new uploads embed under both.
2. ``status``: which sources are not yet ready under the next model.
3. ``flip``: one row; refused while a source (not failed) is not ready under the next model,
   in the same statement that flips, so nothing slips between the check and the flip.
4. ``clean``: delete the rows of every other model; the live model's are never touched.

An organization without a settings row of its own follows the platform's; ``prepare`` gives it
one (its current live model, and the next). A switch of the platform's row moves every
organization that has none: prepare those organizations first (docs/knowledge.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from contextcore.knowledge import store
from contextcore.storage.tenancy import Connection, TenantConnection, TenantQuery

FAILED = TenantQuery(
    "knowledge.failed",
    """
-- knowledge.failed: this scope's failed sources, newest first, with the reason.
SELECT id, title, coalesce(uri, object_key) AS identity, status_reason, updated_at,
       sections IS NOT NULL AS has_text
FROM knowledge_sources
WHERE organization_id IS NOT DISTINCT FROM $1 AND status = 'failed'
ORDER BY updated_at DESC, id
LIMIT $2
""",
)

SOURCES_UNDER = TenantQuery(
    "knowledge.sources_under",
    """
-- knowledge.sources_under: every source of this scope and its state under model $2.
SELECT s.id, s.title, s.status, s.generation, m.status AS model_status, m.generation AS
       model_generation, m.chunks_stored, m.chunk_count
FROM knowledge_sources s
LEFT JOIN knowledge_source_models m ON m.source_id = s.id AND m.embedding_model = $2
WHERE s.organization_id IS NOT DISTINCT FROM $1
ORDER BY s.created_at, s.id
""",
)

SET_NEXT = TenantQuery(
    "knowledge.set_next",
    """
-- knowledge.set_next: step 1 of a switch; the scope gets a row of its own when it had none.
INSERT INTO knowledge_settings AS k (organization_id, active_embedding_model,
                                     next_embedding_model)
VALUES ($1, knowledge_active_model($1), $2)
ON CONFLICT ON CONSTRAINT knowledge_settings_one_row_per_scope
DO UPDATE SET next_embedding_model = EXCLUDED.next_embedding_model, updated_at = now()
RETURNING active_embedding_model
""",
)

FLIP = TenantQuery(
    "knowledge.flip",
    """
-- knowledge.flip: step 3, one row, only when every source of the scope that is not failed is
-- ready under the next model in its current generation.
UPDATE knowledge_settings k
SET active_embedding_model = k.next_embedding_model, next_embedding_model = NULL,
    updated_at = now()
WHERE k.organization_id IS NOT DISTINCT FROM $1 AND k.next_embedding_model IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM knowledge_sources s
      WHERE s.organization_id IS NOT DISTINCT FROM $1 AND s.status <> 'failed'
        AND NOT EXISTS (
            SELECT 1 FROM knowledge_source_models m
            WHERE m.source_id = s.id AND m.embedding_model = k.next_embedding_model
              AND m.status = 'ready' AND m.generation = s.generation))
RETURNING active_embedding_model
""",
)

OTHER_MODELS = TenantQuery(
    "knowledge.other_models",
    """
-- knowledge.other_models: chunks per model of this scope that is neither live nor next.
SELECT embedding_model, count(*) AS chunks
FROM knowledge_chunks
WHERE organization_id IS NOT DISTINCT FROM $1 AND embedding_model <> ALL($2::text[])
GROUP BY embedding_model
ORDER BY embedding_model
""",
)

DELETE_OTHER_CHUNKS = TenantQuery(
    "knowledge.delete_other_chunks",
    """
-- knowledge.delete_other_chunks: step 4, a bounded batch of another model's chunks.
DELETE FROM knowledge_chunks
WHERE id IN (
    SELECT id FROM knowledge_chunks
    WHERE organization_id IS NOT DISTINCT FROM $1 AND embedding_model <> ALL($2::text[])
    LIMIT $3)
""",
)

DELETE_OTHER_STATES = TenantQuery(
    "knowledge.delete_other_states",
    """
-- knowledge.delete_other_states: step 4, the per-model rows of the models deleted.
DELETE FROM knowledge_source_models
WHERE organization_id IS NOT DISTINCT FROM $1 AND embedding_model <> ALL($2::text[])
""",
)


_REGISTER_MODEL_SQL = """
-- knowledge.register_model: a model of the global catalog, as the schema owner (the service
-- role may read the catalog, never write it: migration 00015); a known name keeps its row.
INSERT INTO knowledge_models (name, dimensions) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING
"""

_MODEL_DIMENSIONS_SQL = """
-- knowledge.model_dimensions: the dimensions the catalog holds for a model.
SELECT dimensions FROM knowledge_models WHERE name = $1
"""


@dataclass(frozen=True)
class FailedSource:
    id: UUID
    title: str
    identity: str
    reason: str
    updated_at: datetime
    has_text: bool


@dataclass(frozen=True)
class SourceUnder:
    id: UUID
    title: str
    status: str
    ready: bool
    """Ready under the model asked about, in the source's current generation."""
    progress: str


async def failed(tenant: TenantConnection, limit: int = 100) -> list[FailedSource]:
    rows = await tenant.fetch(FAILED, limit)
    return [
        FailedSource(
            r["id"], r["title"], r["identity"], r["status_reason"], r["updated_at"], r["has_text"]
        )
        for r in rows
    ]


async def sources_under(tenant: TenantConnection, model: str) -> list[SourceUnder]:
    rows = await tenant.fetch(SOURCES_UNDER, model)
    return [
        SourceUnder(
            r["id"],
            r["title"],
            r["status"],
            r["model_status"] == "ready" and r["model_generation"] == r["generation"],
            "not started"
            if r["model_status"] is None
            else f"{r['model_status']} {r['chunks_stored']}/{r['chunk_count']}",
        )
        for r in rows
    ]


async def register_model(owner: Connection, model: str, dimensions: int) -> None:
    """Make ``model`` known: a row of the global catalog, which every tenant's chunks and
    searches name. ``owner`` is a connection of the schema owner: the catalog belongs to no
    tenant, and the service role, which every tenant scope becomes, may not write it.

    Raises:
        ValueError: the model is known with other dimensions.
    """
    async with owner.transaction():
        await owner.execute(_REGISTER_MODEL_SQL, model, dimensions)
        known = await owner.fetchval(_MODEL_DIMENSIONS_SQL, model)
    if known != dimensions:
        raise ValueError(f"{model} is registered with {known} dimensions, not {dimensions}")


async def set_next(tenant: TenantConnection, model: str) -> str:
    """Step 1's row; the scope's live model (which must differ from ``model``)."""
    active, _ = await store.models(tenant)
    if active == model:
        raise ValueError(f"{model} is already the live model of this scope")
    live: str = await tenant.fetchval(SET_NEXT, model)
    return live


async def flip(tenant: TenantConnection) -> str | None:
    """Step 3: the new live model, or ``None`` when the flip was refused."""
    model: str | None = await tenant.fetchval(FLIP)
    return model


async def other_models(tenant: TenantConnection) -> dict[str, int]:
    active, switching = await store.models(tenant)
    keep = [active] if switching is None else [active, switching]
    return {r["embedding_model"]: r["chunks"] for r in await tenant.fetch(OTHER_MODELS, keep)}


async def clean_batch(tenant: TenantConnection, batch: int = 5_000) -> int:
    """Step 4, one bounded batch; the chunks it deleted (0: done, and the states go too)."""
    active, switching = await store.models(tenant)
    keep = [active] if switching is None else [active, switching]
    status = await tenant.execute(DELETE_OTHER_CHUNKS, keep, batch)
    deleted = int(status.rsplit(" ", 1)[-1])
    if deleted == 0:
        await tenant.execute(DELETE_OTHER_STATES, keep)
    return deleted
