"""What the admin commands read and change (``contextcore knowledge``), in one scope at a time.

The model switch, in the spec's four steps, each refusing to run out of order:

1. ``prepare``: the scope's ``next_embedding_model`` is set (the model registered with its
   dimensions); every source is then embedded under it too (the command asks the upload
   consumer), while the live model's chunks keep serving; new uploads embed under both.
2. ``status``: which sources are not yet ready under the next model.
3. ``flip``: one row; refused while a source (not failed) is not ready under the next model,
   in the same statement that flips, so nothing slips between the check and the flip.
4. ``clean``: delete the rows of every other model; the live model's are never touched.

An organization without a settings row of its own follows the platform's; its ``prepare`` gives
it one (its current live model, and the next). A switch of the platform's row moves every
organization that has none, so it waits for their sources too: the platform's ``prepare`` asks
for them (:func:`followers_to_embed`, as the owner) and its ``flip`` is refused while any is not
ready (migration 00019).

Documents: :func:`documents` lists a scope's, :func:`delete_document` deletes one with its chunks;
a trigger records the deletion (migrations 00018, 00021).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from contextcore.knowledge.adapters import store
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
-- ready under the next model in its current generation; for the platform's row, every source
-- of the organizations that follow it too (migration 00019: a count, across tenants).
UPDATE knowledge_settings k
SET active_embedding_model = k.next_embedding_model, next_embedding_model = NULL,
    updated_at = now()
WHERE k.organization_id IS NOT DISTINCT FROM $1 AND k.next_embedding_model IS NOT NULL
  AND ($1 IS NOT NULL
       OR contextcore_knowledge_followers_not_ready(k.next_embedding_model) = 0)
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


FOLLOWERS_NOT_READY = TenantQuery(
    "knowledge.followers_not_ready",
    """
-- knowledge.followers_not_ready: sources of the organizations that follow the platform's model
-- (no settings row of their own) not ready under model $2; 0 outside the platform's scope.
SELECT CASE WHEN $1::uuid IS NULL THEN contextcore_knowledge_followers_not_ready($2) ELSE 0 END
""",
)

_FOLLOWERS_TO_EMBED_SQL = """
-- knowledge.followers_to_embed: as the owner, which sources of following organizations are not
-- ready under a model (migration 00019)
SELECT organization_id, source_id FROM contextcore_knowledge_followers_to_embed($1)
"""

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


async def followers_not_ready(tenant: TenantConnection, model: str) -> int:
    """In the platform's scope: how many sources of the organizations that follow it are not
    ready under ``model`` (its flip waits for them); 0 in an organization's scope."""
    count: int = await tenant.fetchval(FOLLOWERS_NOT_READY, model)
    return count


async def followers_to_embed(owner: Connection, model: str) -> list[tuple[UUID, UUID]]:
    """As the schema owner: (organization, source) of every source of a following organization
    not ready under ``model``, for a platform switch's first step."""
    rows = await owner.fetch(_FOLLOWERS_TO_EMBED_SQL, model)
    return [(r["organization_id"], r["source_id"]) for r in rows]


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


# ------------------------------------------------------------------------------ documents

DOCUMENTS = TenantQuery(
    "knowledge.documents",
    """
-- knowledge.documents: this scope's documents, newest first, a page after the cursor
-- ($2, $3: the last page's created_at and id; null for the first), with each one's state
-- under the scope's live model.
SELECT s.id, s.title, coalesce(s.uri, s.object_key) AS identity, s.kind, s.media_type,
       s.status, s.status_reason, s.size_bytes, s.generation, s.created_at, s.updated_at,
       live.model, m.chunk_count, m.status AS model_status
FROM knowledge_sources s
CROSS JOIN (SELECT knowledge_active_model($1) AS model) live
LEFT JOIN knowledge_source_models m
       ON m.source_id = s.id AND m.embedding_model = live.model
WHERE s.organization_id IS NOT DISTINCT FROM $1
  AND ($2::timestamptz IS NULL OR (s.created_at, s.id) < ($2::timestamptz, $3::uuid))
  AND ($4::text IS NULL OR s.status = $4::text)
ORDER BY s.created_at DESC, s.id DESC
LIMIT $5
""",
)

DOCUMENT_BY_IDENTITY = TenantQuery(
    "knowledge.document_by_identity",
    """
-- knowledge.document_by_identity: the sources of this scope a uri or object key names (a uri of
-- one may equal the object key of another: both are returned, and the caller refuses).
SELECT id FROM knowledge_sources
WHERE organization_id IS NOT DISTINCT FROM $1 AND (uri = $2 OR object_key = $2)
LIMIT 2
""",
)

DELETE_DOCUMENT = TenantQuery(
    "knowledge.delete_document",
    """
-- knowledge.delete_document: the source goes, and with it (ON DELETE CASCADE) its per-model
-- rows and its chunks, in this transaction: the document leaves every search at once. A trigger
-- records the deletion (migration 00021), with who asked ($3, through the transaction's
-- setting, read before any row goes).
WITH asked AS (
    SELECT set_config('contextcore.requested_by', coalesce($3::text, ''), true) AS done
)
DELETE FROM knowledge_sources s
WHERE s.organization_id IS NOT DISTINCT FROM $1 AND s.id = $2
  AND (SELECT done IS NOT NULL FROM asked)
RETURNING s.id
""",
)

DELETION_OF = TenantQuery(
    "knowledge.deletion_of",
    """
-- knowledge.deletion_of: the record the trigger wrote of a source's deletion.
SELECT source_id, title, identity, chunks, login, requested_by, deleted_at
FROM knowledge_deletions
WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2
ORDER BY id DESC
LIMIT 1
""",
)

DELETIONS = TenantQuery(
    "knowledge.deletions",
    """
-- knowledge.deletions: this scope's deleted documents, newest first.
SELECT source_id, title, identity, chunks, login, requested_by, deleted_at
FROM knowledge_deletions
WHERE organization_id IS NOT DISTINCT FROM $1
ORDER BY deleted_at DESC, id DESC
LIMIT $2
""",
)


@dataclass(frozen=True)
class Document:
    """One document of a scope, as ``list`` shows it."""

    id: UUID
    title: str
    identity: str
    """Its uri, or its object key."""
    kind: str
    media_type: str
    status: str
    """Its state under the scope's live model: ``pending``, ``ready`` or ``failed``."""
    reason: str | None
    size_bytes: int | None
    """As uploaded; ``None`` until its text has been read."""
    generation: int
    uploaded_at: datetime
    updated_at: datetime
    model: str
    """The scope's live model."""
    chunks: int | None
    """Its chunks under the live model (``None``: not chunked under it)."""


@dataclass(frozen=True)
class Deletion:
    source_id: UUID
    title: str
    identity: str
    chunks: int
    login: str
    """The database login that deleted it."""
    requested_by: str | None
    deleted_at: datetime


MAX_PAGE = 1_000


async def documents(
    tenant: TenantConnection,
    *,
    limit: int = 100,
    after: tuple[datetime, UUID] | None = None,
    status: str | None = None,
) -> list[Document]:
    """A page of the scope's documents, newest first; the next page starts ``after`` the last
    one's ``(uploaded_at, id)``."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"a page holds 1 to {MAX_PAGE} documents, not {limit}")
    rows = await tenant.fetch(
        DOCUMENTS, after[0] if after else None, after[1] if after else None, status, limit
    )
    return [
        Document(
            r["id"],
            r["title"],
            r["identity"],
            r["kind"],
            r["media_type"],
            r["status"],
            r["status_reason"],
            r["size_bytes"],
            r["generation"],
            r["created_at"],
            r["updated_at"],
            r["model"],
            r["chunk_count"],
        )
        for r in rows
    ]


async def find_document(tenant: TenantConnection, identity: str) -> UUID | None:
    """The source of this scope a uri or object key names.

    Raises:
        ValueError: two documents answer to it (one's uri is another's object key).
    """
    rows = await tenant.fetch(DOCUMENT_BY_IDENTITY, identity)
    if len(rows) > 1:
        raise ValueError(f"{identity!r} names two documents of this scope: name one by its id")
    return rows[0]["id"] if rows else None


async def delete_document(
    tenant: TenantConnection, source_id: UUID, *, requested_by: str | None = None
) -> Deletion | None:
    """Delete one document of the scope (``None``: the scope has no such document). It leaves
    search when ``tenant``'s transaction commits."""
    row = await tenant.fetchrow(DELETE_DOCUMENT, source_id, requested_by)
    if row is None:
        return None
    record = await tenant.fetchrow(DELETION_OF, source_id)
    assert record is not None, "migration 00021's trigger records every deletion"
    return _deletion(record)


async def deletions(tenant: TenantConnection, limit: int = 100) -> list[Deletion]:
    return [_deletion(r) for r in await tenant.fetch(DELETIONS, limit)]


def _deletion(record: asyncpg.Record) -> Deletion:
    """A row of ``knowledge_deletions`` (:data:`DELETIONS`' and :data:`DELETION_OF`'s columns)."""
    return Deletion(
        record["source_id"],
        record["title"],
        record["identity"],
        record["chunks"],
        record["login"],
        record["requested_by"],
        record["deleted_at"],
    )
