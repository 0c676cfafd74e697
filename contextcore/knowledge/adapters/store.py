"""The knowledge tables through the tenancy layer: named, commented SQL, the steps of ingestion,
and the two adapters the domain's knowledge logic writes through
(:class:`PostgresKnowledgeRepository` for ingestion, :class:`PostgresChunkStore` for the embedder).

Every statement runs in a scope (:class:`~contextcore.storage.tenancy.TenantConnection`): an
organization's or the platform's, whose id (``None`` for the platform) is ``$1``. Row-level
security repeats the filter (migration 00007).

Ingestion in two transactions per document, then one per embedding batch:

1. :func:`accept` (or :func:`restart_generation`): the source row is created or updated
   (``pending``, a new generation). A generation that was still pending is replaced: its
   uploader's address, which the row then forgets, comes back as :class:`Superseded`, so that
   uploader can be told (a final status).
2. :func:`record_text` / :func:`record_failure`: the extracted text and, per target model, how
   many chunks this generation has; or the reason it failed.
3. :func:`store_batch`: one batch of embedded chunks, under the per-model row's lock: it inserts
   what is missing (a redelivered batch inserts nothing), counts it, and when the generation is
   complete marks the model ready, deletes the older generations' chunks, and marks the source
   ready when the model is its scope's live one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from contextcore.knowledge.chunk import Chunk
from contextcore.knowledge.embed import BatchRefused
from contextcore.knowledge.extract import Section
from contextcore.knowledge.ingest import (
    CONSUMER,
    NewSource,
    NoSuchOrganization,
    Opened,
    OverQuota,
    UploadRefused,
)
from contextcore.knowledge.state import (
    DELETED,
    Accepted,
    BatchResult,
    SourceState,
    Superseded,
)
from contextcore.quotas import NO_QUOTAS, Quotas
from contextcore.storage import ledger
from contextcore.storage.quotas import LOCK_ORGANIZATION, QUOTAS
from contextcore.storage.tenancy import (
    PLATFORM,
    SERVICE_ROLE,
    Connection,
    Scope,
    TenantConnection,
    TenantDatabase,
    TenantQuery,
    service_role,
)

MODELS = TenantQuery(
    "knowledge.models",
    """
-- knowledge.models: the scope's live model and the one a switch is moving to, if any; an
-- organization without a row of its own follows the platform's.
SELECT active_embedding_model, next_embedding_model FROM knowledge_settings
WHERE organization_id IS NOT DISTINCT FROM $1 OR organization_id IS NULL
ORDER BY organization_id NULLS LAST
LIMIT 1
""",
)


def _accept_by(identity: str) -> TenantQuery:
    """knowledge.accept_by_<identity>: one upsert for both identities of a source, its
    ``uri`` or its ``object_key`` (each with its own partial unique index, so each its own
    conflict target)."""
    name = "uri" if identity == "uri" else "object"
    return TenantQuery(
        f"knowledge.accept_by_{name}",
        f"""
-- knowledge.accept_by_{name}: create the source (pending), or, for a known (organization,
-- {identity}), start its next generation; the uploader's address replaces the previous one.
-- RETURNING old.* (PostgreSQL 18): the replaced generation's status and uploader, read under the
-- row's lock, so exactly one accept learns that a pending generation was replaced, and whom to
-- tell.
INSERT INTO knowledge_sources AS s (id, organization_id, kind, title, {identity}, media_type,
                                    status, pending_since, reply_to, correlation_id, upload_key)
VALUES ($2, $1, $3, $4, $5, $6, 'pending', now(), $7, $8, $9)
ON CONFLICT (organization_id, {identity}) WHERE {identity} IS NOT NULL DO UPDATE
SET kind = EXCLUDED.kind, title = EXCLUDED.title, media_type = EXCLUDED.media_type,
    status = 'pending', status_reason = NULL, pending_since = now(), updated_at = now(),
    generation = s.generation + 1, sections = NULL, content_sha256 = NULL,
    reply_to = EXCLUDED.reply_to, correlation_id = EXCLUDED.correlation_id,
    upload_key = EXCLUDED.upload_key
RETURNING s.id, s.generation, old.status AS replaced_status,
          old.generation AS replaced_generation, old.reply_to AS replaced_reply_to,
          old.correlation_id AS replaced_correlation_id
""",
    )


ACCEPT_BY_URI = _accept_by("uri")
ACCEPT_BY_OBJECT = _accept_by("object_key")

_SOURCE_COLUMNS = """
SELECT s.id, s.organization_id, s.title, s.media_type, s.status, s.status_reason, s.generation,
       s.updated_at, s.reply_to, s.correlation_id, s.upload_key, s.sections,
       (SELECT m.chunk_count FROM knowledge_source_models m
        WHERE m.source_id = s.id AND m.embedding_model = knowledge_active_model($1)) AS chunks
FROM knowledge_sources s
WHERE s.organization_id IS NOT DISTINCT FROM $1"""

SOURCE = TenantQuery(
    "knowledge.source",
    """
-- knowledge.source: one source of this scope, its text, and its chunk count under the live
-- model."""
    + _SOURCE_COLUMNS
    + "\n  AND s.id = $2\n",
)

SOURCE_BY_IDENTITY = TenantQuery(
    "knowledge.source_by_identity",
    """
-- knowledge.source_by_identity: the source of this scope with this uri or object key."""
    + _SOURCE_COLUMNS
    + "\n  AND (s.uri = $2 OR s.object_key = $3)\n",
)

RECORD_TEXT = TenantQuery(
    "knowledge.record_text",
    """
-- knowledge.record_text: the extracted sections of the generation being ingested, and the size
-- of the document they came from (kept when $6 is null: the text was stored before).
UPDATE knowledge_sources
SET sections = $4::jsonb, content_sha256 = $5, size_bytes = coalesce($6, size_bytes),
    updated_at = now()
WHERE organization_id IS NOT DISTINCT FROM $1 AND id = $2 AND generation = $3
  AND status = 'pending'
""",
)

EXPECT_CHUNKS = TenantQuery(
    "knowledge.expect_chunks",
    """
-- knowledge.expect_chunks: generation $3 of the source has $5 chunks under model $4. A row of an
-- older generation starts again; a row of this generation that is not ready (a redelivered
-- command, a retried switch) keeps the count of what is already stored, so batches that find
-- their chunks stored can still complete it. Nothing happens when the source has moved on to a
-- later generation, and a row never goes back to an older one. Run after LOCK_MODEL_STATE, so
-- the count sees every batch committed before it.
WITH stored AS (
    SELECT count(*)::integer AS n FROM knowledge_chunks
    WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2 AND embedding_model = $4
      AND generation = $3
)
INSERT INTO knowledge_source_models AS m (organization_id, source_id, embedding_model,
                                          generation, chunk_count, chunks_stored, status,
                                          pending_since)
SELECT $1, $2, $4, $3, $5, stored.n,
       CASE WHEN stored.n = $5 THEN 'ready' ELSE 'pending' END,
       CASE WHEN stored.n = $5 THEN NULL ELSE now() END
FROM stored
WHERE EXISTS (SELECT 1 FROM knowledge_sources s
              WHERE s.organization_id IS NOT DISTINCT FROM $1 AND s.id = $2
                AND s.generation = $3)
ON CONFLICT (source_id, embedding_model) DO UPDATE
SET generation = EXCLUDED.generation, chunk_count = EXCLUDED.chunk_count,
    chunks_stored = EXCLUDED.chunks_stored, status = EXCLUDED.status, status_reason = NULL,
    pending_since = EXCLUDED.pending_since, updated_at = now()
WHERE m.generation < EXCLUDED.generation
   OR (m.generation = EXCLUDED.generation AND m.status <> 'ready')
""",
)

RESTART = TenantQuery(
    "knowledge.restart",
    """
-- knowledge.restart: a new generation of a source from its stored text (a retry), pending
-- again under the key of the command that asked; RETURNING old.* as in accept_by_uri.
UPDATE knowledge_sources AS s
SET generation = s.generation + 1, status = 'pending', status_reason = NULL,
    pending_since = now(), updated_at = now(), upload_key = $3, reply_to = $4,
    correlation_id = $5
WHERE s.organization_id IS NOT DISTINCT FROM $1 AND s.id = $2 AND s.sections IS NOT NULL
RETURNING s.id, s.generation, old.status AS replaced_status,
          old.generation AS replaced_generation, old.reply_to AS replaced_reply_to,
          old.correlation_id AS replaced_correlation_id
""",
)

ORGANIZATION_EXISTS = TenantQuery(
    "knowledge.organization_exists",
    """
-- knowledge.organization_exists: whether the scope's organization is one the database holds
-- (RLS shows the scope its own row only). An upload for one that is not is refused before the
-- ledger or a source is written: its foreign keys would refuse it on every retry.
SELECT EXISTS (SELECT 1 FROM organizations WHERE id = $1)
""",
)

UPLOADS_IN_FLIGHT = TenantQuery(
    "knowledge.uploads_in_flight",
    """
-- knowledge.uploads_in_flight: the scope's pending sources, other than the one with this
-- identity (uri $2, object key $3; an inline upload has neither and is a source of its own),
-- counted up to $4 (the quota uploads_in_flight: no need to count further). Run under the
-- organization's quota lock (quotas.lock_organization).
SELECT count(*) FROM (
    SELECT 1 FROM knowledge_sources AS s
    WHERE s.organization_id = $1 AND s.status = 'pending'
      AND NOT (coalesce(s.uri = $2, false) OR coalesce(s.object_key = $3, false))
    LIMIT $4
) AS pending
""",
)

CHUNKS_HELD = TenantQuery(
    "knowledge.chunks_held",
    """
-- knowledge.chunks_held: the chunks the scope's other sources hold or are storing under model
-- $3 (their current generations' counts, ready or pending), for the quota stored_chunks. Run
-- under the organization's quota lock.
SELECT coalesce(sum(m.chunk_count), 0) FROM knowledge_source_models AS m
WHERE m.organization_id = $1 AND m.embedding_model = $3 AND m.source_id <> $2
  AND m.status IN ('pending', 'ready')
""",
)

FAIL_SOURCE = TenantQuery(
    "knowledge.fail_source",
    """
-- knowledge.fail_source: the generation being ingested failed, with the reason.
UPDATE knowledge_sources
SET status = 'failed', status_reason = $4, pending_since = NULL, updated_at = now()
WHERE organization_id IS NOT DISTINCT FROM $1 AND id = $2 AND generation = $3
  AND status = 'pending'
RETURNING id
""",
)

LOCK_MODEL_STATE = TenantQuery(
    "knowledge.lock_model_state",
    """
-- knowledge.lock_model_state: the per-model row a batch belongs to, locked until the batch
-- commits, so two batches of one source count their chunks one after the other.
SELECT generation, chunk_count, chunks_stored, status FROM knowledge_source_models
WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2 AND embedding_model = $3
FOR UPDATE
""",
)

DELETED_WHILE_PENDING = TenantQuery(
    "knowledge.deleted_while_pending",
    """
-- knowledge.deleted_while_pending: the uploader of a source deleted before it was ready, whose
-- batches still arrive (the deletion record keeps its reply address, migration 00023)
SELECT title, deleted_at, reply_to, correlation_id, generation FROM knowledge_deletions
WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2
  AND reply_to IS NOT NULL AND correlation_id IS NOT NULL
ORDER BY deleted_at DESC
LIMIT 1
""",
)

"""What an uploader hears when its document was deleted before it was ready."""
MAX_REASON_CHARS = 2_000

TOLD_DELETED = "knowledge.told_deleted"
"""The ledger's consumer name of "this deleted source's uploader was told"."""

INSERT_CHUNKS = TenantQuery(
    "knowledge.insert_chunks",
    """
-- knowledge.insert_chunks: a batch of embedded chunks; one already stored is skipped.
INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation, ordinal,
                              section, text, tokens, embedding)
SELECT $1, $2, $3, $4, c.ordinal, c.section, c.text, c.tokens, c.embedding::vector
FROM unnest($5::integer[], $6::text[], $7::text[], $8::integer[], $9::text[])
     AS c(ordinal, section, text, tokens, embedding)
ON CONFLICT (source_id, embedding_model, generation, ordinal) DO NOTHING
""",
)

COUNT_STORED = TenantQuery(
    "knowledge.count_stored",
    """
-- knowledge.count_stored: add what a batch inserted; the row is ready once all are stored.
UPDATE knowledge_source_models
SET chunks_stored = chunks_stored + $4,
    status = CASE WHEN chunks_stored + $4 = chunk_count THEN 'ready' ELSE status END,
    pending_since = CASE WHEN chunks_stored + $4 = chunk_count THEN NULL ELSE pending_since END,
    updated_at = now()
WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2 AND embedding_model = $3
RETURNING status
""",
)

DROP_OLD_GENERATIONS = TenantQuery(
    "knowledge.drop_old_generations",
    """
-- knowledge.drop_old_generations: the chunks a complete generation replaces, under its model.
DELETE FROM knowledge_chunks
WHERE organization_id IS NOT DISTINCT FROM $1 AND source_id = $2 AND embedding_model = $3
  AND generation < $4
""",
)

MARK_READY = TenantQuery(
    "knowledge.mark_ready",
    """
-- knowledge.mark_ready: the source is ready once its generation is complete under the scope's
-- live model.
UPDATE knowledge_sources
SET status = 'ready', status_reason = NULL, pending_since = NULL, updated_at = now()
WHERE organization_id IS NOT DISTINCT FROM $1 AND id = $2 AND generation = $3
  AND status = 'pending' AND knowledge_active_model($1) = $4
RETURNING id, organization_id, title, status, status_reason, generation, updated_at, reply_to,
          correlation_id
""",
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def vector_text(vector: Sequence[float]) -> str:
    """pgvector's text form; eight significant digits hold a float32 exactly enough."""
    return "[" + ",".join(f"{x:.8g}" for x in vector) + "]"


async def models(tenant: TenantConnection) -> tuple[str, str | None]:
    """The scope's live model and the model a switch is moving to (or ``None``)."""
    row = await tenant.fetchrow(MODELS)
    if row is None:
        raise LookupError("knowledge_settings has no platform row (migration 00007 adds one)")
    return row["active_embedding_model"], row["next_embedding_model"]


async def accept(
    tenant: TenantConnection,
    *,
    source_id: UUID,
    kind: str,
    title: str,
    uri: str | None,
    object_key: str | None,
    media_type: str,
    reply_to: str | None,
    correlation_id: str | None,
    upload_key: str,
) -> Accepted:
    """Create or restart the source with this identity: its id, the new generation, and the
    pending generation it replaced (whose uploader is to be told)."""
    query, identity = (ACCEPT_BY_URI, uri) if uri is not None else (ACCEPT_BY_OBJECT, object_key)
    row = await tenant.fetchrow(
        query, source_id, kind, title, identity, media_type, reply_to, correlation_id, upload_key
    )
    assert row is not None
    return _accepted(row, reply_to, correlation_id)


def _accepted(row: Any, reply_to: str | None, correlation_id: str | None) -> Accepted:
    """Only a generation still pending is replaced: a finished one told its uploader already.
    Nor is an uploader told when the new generation answers the same address (one producer
    reusing a correlation id would otherwise hear its own upload superseded)."""
    replaced = None
    address = (row["replaced_reply_to"], row["replaced_correlation_id"])
    if (
        row["replaced_status"] == "pending"
        and None not in address
        and address != (reply_to, correlation_id)
    ):
        replaced = Superseded(
            source_id=row["id"],
            by_generation=row["generation"],
            generation=row["replaced_generation"],
            reply_to=row["replaced_reply_to"],
            correlation_id=row["replaced_correlation_id"],
        )
    return Accepted(row["id"], row["generation"], replaced)


def _state(row: Any) -> SourceState:
    sections = None
    if row["sections"] is not None:
        sections = [
            Section(tuple(s["path"]), list(s["paragraphs"])) for s in json.loads(row["sections"])
        ]
    return SourceState(
        id=row["id"],
        organization_id=row["organization_id"],
        title=row["title"],
        status=row["status"],
        status_reason=row["status_reason"],
        generation=row["generation"],
        chunk_count=row["chunks"],
        updated_at=row["updated_at"],
        reply_to=row["reply_to"],
        correlation_id=row["correlation_id"],
        upload_key=row["upload_key"],
        media_type=row["media_type"],
        sections=sections,
    )


async def source(tenant: TenantConnection, source_id: UUID) -> SourceState | None:
    row = await tenant.fetchrow(SOURCE, source_id)
    return None if row is None else _state(row)


async def source_by_identity(
    tenant: TenantConnection, *, uri: str | None, object_key: str | None
) -> SourceState | None:
    row = await tenant.fetchrow(SOURCE_BY_IDENTITY, uri, object_key)
    return None if row is None else _state(row)


def sections_json(sections: list[Section]) -> str:
    return json.dumps(
        [{"path": list(s.path), "paragraphs": s.paragraphs} for s in sections], ensure_ascii=False
    )


async def record_text(
    tenant: TenantConnection,
    source_id: UUID,
    generation: int,
    sections: list[Section],
    chunk_counts: dict[str, int],
    *,
    size_bytes: int | None = None,
) -> None:
    """The extracted sections, how many chunks the generation has under each model, and the
    size of the document as uploaded."""
    text = sections_json(sections)
    await tenant.execute(RECORD_TEXT, source_id, generation, text, digest(text), size_bytes)
    await expect_chunks(tenant, source_id, generation, chunk_counts)


async def restart_generation(
    tenant: TenantConnection,
    source_id: UUID,
    key: str,
    reply_to: str | None,
    correlation_id: str | None,
) -> Accepted | None:
    """Start the next generation from the stored text (see :func:`accept`); ``None`` when the
    source has none."""
    row = await tenant.fetchrow(RESTART, source_id, key, reply_to, correlation_id)
    return None if row is None else _accepted(row, reply_to, correlation_id)


async def expect_chunks(
    tenant: TenantConnection, source_id: UUID, generation: int, counts: dict[str, int]
) -> None:
    """This generation has ``counts[model]`` chunks under each model (a ready row of the same
    generation is left as it is)."""
    for model, count in counts.items():
        await tenant.fetchrow(LOCK_MODEL_STATE, source_id, model)
        await tenant.execute(EXPECT_CHUNKS, source_id, generation, model, count)


async def record_failure(
    tenant: TenantConnection, source_id: UUID, generation: int, reason: str
) -> bool:
    """Fail the generation with ``reason``; ``False`` when it was no longer pending."""
    reason = reason[:MAX_REASON_CHARS] or "failed"
    return await tenant.fetchval(FAIL_SOURCE, source_id, generation, reason) is not None


async def store_batch(
    tenant: TenantConnection,
    source_id: UUID,
    model: str,
    generation: int,
    chunks: Sequence[Chunk],
    vectors: Sequence[Sequence[float]],
) -> BatchResult:
    """Store one batch (each chunk with its vector, in order) under its per-model row's lock;
    see the module docstring."""
    if len(chunks) != len(vectors):
        raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
    state = await tenant.fetchrow(LOCK_MODEL_STATE, source_id, model)
    if state is None:
        deleted = await _told_deleted(tenant, source_id, generation)
        return BatchResult(0, False, None, stale=True, deleted=deleted)
    if state["generation"] != generation or state["status"] != "pending":
        return BatchResult(0, False, None, stale=True)
    status = await tenant.execute(
        INSERT_CHUNKS,
        source_id,
        model,
        generation,
        [c.ordinal for c in chunks],
        [c.section for c in chunks],
        [c.text for c in chunks],
        [c.tokens for c in chunks],
        [vector_text(vector) for vector in vectors],
    )
    inserted = int(status.rsplit(" ", 1)[-1])
    now_status = await tenant.fetchval(COUNT_STORED, source_id, model, inserted)
    if now_status != "ready":
        return BatchResult(inserted, False, None)
    await tenant.execute(DROP_OLD_GENERATIONS, source_id, model, generation)
    row = await tenant.fetchrow(MARK_READY, source_id, generation, model)
    ready = None
    if row is not None:
        ready = SourceState(
            id=row["id"],
            organization_id=row["organization_id"],
            title=row["title"],
            status=row["status"],
            status_reason=row["status_reason"],
            generation=row["generation"],
            chunk_count=state["chunk_count"],
            updated_at=row["updated_at"],
            reply_to=row["reply_to"],
            correlation_id=row["correlation_id"],
        )
    return BatchResult(inserted, True, ready)


async def _told_deleted(
    tenant: TenantConnection, source_id: UUID, generation: int
) -> SourceState | None:
    """A batch of a source deleted while pending: its uploader's ``failed`` status, once (the
    ledger's claim), or ``None`` when it was told already or the source never was."""
    gone = await tenant.fetchrow(DELETED_WHILE_PENDING, source_id)
    if gone is None or not await ledger.claim(tenant, TOLD_DELETED, str(source_id)):
        return None
    return SourceState(
        id=source_id,
        organization_id=tenant.organization_id,
        title=gone["title"],
        status="failed",
        status_reason=DELETED,
        generation=gone["generation"] or generation,
        chunk_count=None,
        updated_at=gone["deleted_at"],
        reply_to=gone["reply_to"],
        correlation_id=gone["correlation_id"],
    )


@dataclass(frozen=True)
class Swept:
    organization_id: UUID | None
    source_id: UUID
    embedding_model: str | None
    title: str | None
    reason: str
    reply_to: str | None
    correlation_id: str | None


_COUNTS_SQL = """
-- knowledge.counts: sources of every tenant by status, and the oldest pending one's age; counts
-- only, through the owner's SECURITY DEFINER function (migration 00014)
SELECT status, sources, oldest_pending_seconds FROM contextcore_knowledge_source_counts()
"""


@dataclass(frozen=True)
class SourceCounts:
    """Sources of every tenant by status (pending, ready, failed), and how long the oldest
    pending one has waited (``None`` when none is pending)."""

    by_status: dict[str, int]
    oldest_pending_seconds: float | None


async def source_counts(conn: Connection, *, role: str = SERVICE_ROLE) -> SourceCounts:
    async with service_role(conn, role=role):
        rows = await conn.fetch(_COUNTS_SQL)
    counts = {status: 0 for status in ("pending", "ready", "failed")}
    oldest: float | None = None
    for row in rows:
        counts[row["status"]] = row["sources"]
        if row["oldest_pending_seconds"] is not None:
            oldest = float(row["oldest_pending_seconds"])
    return SourceCounts(counts, oldest)


_SWEEP_SQL = """
-- knowledge.sweep: fail sources (and per-model states) pending past the age, never under an
-- hour, a bounded batch across tenants, through the owner's SECURITY DEFINER function.
SELECT organization_id, source_id, embedding_model, title, reason, reply_to, correlation_id
FROM contextcore_fail_stale_knowledge($1, $2)
"""


async def sweep(
    conn: Connection, *, older_than: timedelta, batch: int, role: str = SERVICE_ROLE
) -> list[Swept]:
    """Fail what has been pending longer than ``older_than`` (at least an hour: the function's
    floor, whatever is asked); what it failed."""
    if batch <= 0:
        raise ValueError(f"sweep batch must be positive, not {batch}")
    async with service_role(conn, role=role):
        rows = await conn.fetch(_SWEEP_SQL, older_than, batch)
    return [Swept(**dict(row)) for row in rows]


async def _quotas(tenant: TenantConnection, organization_id: UUID | None) -> Quotas:
    """The organization's quotas in force; the platform's own documents have none."""
    if organization_id is None:
        return NO_QUOTAS
    row = await tenant.fetchrow(QUOTAS)
    return NO_QUOTAS if row is None else Quotas.of(row)


async def _room_for_an_upload(tenant: TenantConnection, new: NewSource, quota: int) -> None:
    """Raises :class:`OverQuota` when the scope has ``quota`` uploads pending already (a new
    generation of a pending source takes no more room). Holds the quota lock until the
    transaction ends, so a concurrent upload counts this one."""
    await tenant.execute(LOCK_ORGANIZATION)
    pending = await tenant.fetchval(UPLOADS_IN_FLIGHT, new.uri, new.object_key, quota)
    if pending >= quota:
        raise OverQuota(
            f"the organization has {pending:,} uploads in flight, its quota uploads_in_flight: "
            "upload again once some are ready, or ask the operator to raise it"
        )


async def _room_for_chunks(
    tenant: TenantConnection, source_id: UUID, counts: dict[str, int], quota: int
) -> None:
    """Raises :class:`OverQuota` when the source's chunks under a model, with those the scope's
    other sources hold under it, would pass ``quota``; under the quota lock, as above."""
    await tenant.execute(LOCK_ORGANIZATION)
    for model, count in counts.items():
        held = await tenant.fetchval(CHUNKS_HELD, source_id, model)
        if held + count > quota:
            raise OverQuota(
                f"the document makes {count:,} chunks and the organization holds {held:,}, "
                f"over its quota stored_chunks ({quota:,}): delete documents, or ask the "
                "operator to raise it"
            )


def _scope(organization_id: UUID | None) -> Scope:
    """The tenancy scope of an organization's rows, or of the platform's (``None``)."""
    return organization_id if organization_id is not None else PLATFORM


class PostgresChunkStore:
    """The embedder's :class:`~contextcore.knowledge.embed.ChunkStore` on PostgreSQL: each batch
    in one transaction of its scope (:func:`store_batch`)."""

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def store_batch(
        self,
        organization_id: UUID | None,
        source_id: UUID,
        model: str,
        generation: int,
        chunks: Sequence[Chunk],
        vectors: Sequence[Sequence[float]],
    ) -> BatchResult:
        try:
            async with self.database.writing(_scope(organization_id)) as tenant:
                return await store_batch(tenant, source_id, model, generation, chunks, vectors)
        except _REFUSED_FOR_GOOD as error:
            log.warning("a batch of %s was refused: %s: %s", source_id, type(error).__name__, error)
            raise BatchRefused(
                "the database refused one of its passages (text it cannot hold)"
            ) from error

    async def fail(
        self, organization_id: UUID | None, source_id: UUID, generation: int, reason: str
    ) -> SourceState | None:
        async with self.database.writing(_scope(organization_id)) as tenant:
            if not await record_failure(tenant, source_id, generation, reason):
                return None
            return await source(tenant, source_id)


_REFUSED_FOR_GOOD = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
)
"""What PostgreSQL answers a value it will never store (SQLSTATE classes 22, 23, 54): the same
batch again is refused again."""
_UPLOAD_REFUSED_FOR_GOOD = (
    asyncpg.DataError,
    asyncpg.ProgramLimitExceededError,
    asyncpg.CheckViolationError,
    asyncpg.NotNullViolationError,
)
"""The same for opening an upload, but for a unique violation and a missing organization row (a
foreign key): the accepts are upserts and the claim skips a key it holds, so a unique violation
is not expected and is left to the retries; an organization deleted meanwhile is found missing
by the retry and refused as ``NoSuchOrganization``."""
log = logging.getLogger("contextcore.knowledge")


class PostgresKnowledgeRepository:
    """Ingestion's :class:`~contextcore.knowledge.ingest.KnowledgeRepository` on PostgreSQL:
    each method one transaction of its scope, of the steps above."""

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def open_upload(
        self, organization_id: UUID | None, upload_key: str, new: NewSource
    ) -> Opened:
        started = None
        try:
            async with self.database.writing(_scope(organization_id)) as tenant:
                if organization_id is not None and not await tenant.fetchval(ORGANIZATION_EXISTS):
                    raise NoSuchOrganization(f"no such organization: {organization_id}")
                claimed = await ledger.claim(tenant, CONSUMER, upload_key)
                quotas = await _quotas(tenant, organization_id)
                if claimed and quotas.uploads_in_flight is not None:
                    await _room_for_an_upload(tenant, new, quotas.uploads_in_flight)
                if claimed:
                    started = await accept(
                        tenant,
                        source_id=uuid4(),
                        kind=new.kind,
                        title=new.title,
                        uri=new.uri,
                        object_key=new.object_key,
                        media_type=new.media_type,
                        reply_to=new.reply_to,
                        correlation_id=new.correlation_id,
                        upload_key=upload_key,
                    )
                    state = await source(tenant, started.source_id)
                else:
                    state = await source_by_identity(tenant, uri=new.uri, object_key=new.object_key)
                live, switching = await models(tenant)
        except _UPLOAD_REFUSED_FOR_GOOD as error:
            log.warning("an upload was refused: %s: %s", type(error).__name__, error)
            # the log has the database's words; the uploader hears none of them
            refused = "the database refuses this upload (a value it cannot hold)"
            raise UploadRefused(refused) from error
        return Opened(claimed, started, state, live, switching, quotas)

    async def open_reingest(
        self,
        organization_id: UUID | None,
        key: str,
        source_id: UUID,
        *,
        restart: bool,
        reply_to: str | None,
        correlation_id: str | None,
    ) -> Opened:
        started = None
        async with self.database.writing(_scope(organization_id)) as tenant:
            claimed = await ledger.claim(tenant, CONSUMER, key)
            if claimed and restart:
                started = await restart_generation(tenant, source_id, key, reply_to, correlation_id)
            state = await source(tenant, source_id)
            live, switching = await models(tenant)
        # no quotas: a re-ingestion cuts the sections its upload stored, within them then
        return Opened(claimed, started, state, live, switching)

    async def source(self, organization_id: UUID | None, source_id: UUID) -> SourceState | None:
        async with self.database.writing(_scope(organization_id)) as tenant:
            return await source(tenant, source_id)

    async def record_text(
        self,
        source_state: SourceState,
        sections: list[Section],
        chunk_counts: dict[str, int],
        size_bytes: int | None,
        *,
        stored_chunks: int | None = None,
    ) -> SourceState | None:
        async with self.database.writing(_scope(source_state.organization_id)) as tenant:
            if stored_chunks is not None:
                await _room_for_chunks(tenant, source_state.id, chunk_counts, stored_chunks)
            await record_text(
                tenant,
                source_state.id,
                source_state.generation,
                sections,
                chunk_counts,
                size_bytes=size_bytes,
            )
            return await source(tenant, source_state.id)

    async def expect_chunks(
        self, source_state: SourceState, chunk_counts: dict[str, int]
    ) -> SourceState | None:
        async with self.database.writing(_scope(source_state.organization_id)) as tenant:
            await expect_chunks(tenant, source_state.id, source_state.generation, chunk_counts)
            return await source(tenant, source_state.id)

    async def fail(self, source_state: SourceState, reason: str) -> SourceState | None:
        async with self.database.writing(_scope(source_state.organization_id)) as tenant:
            await record_failure(tenant, source_state.id, source_state.generation, reason)
            return await source(tenant, source_state.id)
