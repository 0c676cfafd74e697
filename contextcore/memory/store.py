"""The memory tables through the tenancy layer: named, commented SQL (migration 00009).

Every statement runs in one organization's scope; ``$1`` is its id and row-level security
repeats the filter. Nothing here updates a revision: each state change is one insert.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg

from contextcore.memory.models import (
    AgentMemory,
    Change,
    MemorySubjectRef,
    Refusal,
    Scope,
    parse_stored_refs,
)
from contextcore.storage.tenancy import TenantConnection, TenantQuery

_COLUMNS = (
    "organization_id, id, definition_id, scope, user_id, subject_key, text, subject_refs, "
    "proposed_by_run_id, supersedes_id, forgotten_at, created_at"
)

HEAD = TenantQuery(
    "memory.head",
    f"""
-- memory.head: the current revision of one chain (a tombstone included), or no row for a new
-- chain. The exact head, never a time sort: two revisions can share a timestamp.
SELECT {_COLUMNS}
FROM memory_heads
WHERE organization_id = $1 AND definition_id = $2 AND scope = $3 AND scope_owner_id = $4
  AND subject_key = $5
""",
)

HEAD_BY_ID = TenantQuery(
    "memory.head_by_id",
    f"""
-- memory.head_by_id: the revision a forget names, when it is the head of its chain
SELECT {_COLUMNS}
FROM memory_heads
WHERE organization_id = $1 AND id = $2
""",
)

BY_ID = TenantQuery(
    "memory.by_id",
    f"""
-- memory.by_id: one revision of this organization (a journal's answer, replayed)
SELECT {_COLUMNS}
FROM memories
WHERE organization_id = $1 AND id = $2
""",
)

APPEND = TenantQuery(
    "memory.append",
    f"""
-- memory.append: one revision with text after the head the writer read ($8 null: the chain's
-- root; a tombstone is memory.tombstone). No
-- row back when another writer attached to that head (or rooted the chain) first: the unique
-- constraints memories_one_child and memories_one_root conflict, and the writer reloads.
INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key, text,
                      subject_refs, supersedes_id, proposed_by_run_id)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
""",
)

TOMBSTONE = TenantQuery(
    "memory.tombstone",
    f"""
-- memory.tombstone: forget the revision $2 by appending a tombstone after it, copying its chain
-- identity and its stored subject_refs as they are (not as Python parsed them). No row back
-- when another writer attached to it first.
INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key, text,
                      subject_refs, supersedes_id, proposed_by_run_id, forgotten_at)
SELECT organization_id, definition_id, scope, user_id, subject_key, NULL,
       subject_refs, id, $3, clock_timestamp()
FROM memories
WHERE organization_id = $1 AND id = $2
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
""",
)

CLAIM = TenantQuery(
    "memory.claim",
    """
-- memory.claim: the journal row of one write call, by its idempotency key. No row back when the
-- key was used before (a redelivery; a concurrent one waits here for the first to commit).
INSERT INTO memory_writes (organization_id, idempotency_key, request_sha256, operation)
VALUES ($1, $2, $3, $4)
ON CONFLICT (organization_id, idempotency_key) DO NOTHING
RETURNING 1
""",
)

JOURNAL = TenantQuery(
    "memory.journal",
    """
-- memory.journal: what a write call with this idempotency key answered
SELECT request_sha256, outcome, reason, message, memory_id
FROM memory_writes
WHERE organization_id = $1 AND idempotency_key = $2
""",
)

RECORD = TenantQuery(
    "memory.record",
    """
-- memory.record: the answer of the call that claimed this key, in the claim's transaction
UPDATE memory_writes
SET outcome = $3, reason = $4, message = $5, memory_id = $6
WHERE organization_id = $1 AND idempotency_key = $2 AND outcome IS NULL
""",
)


def memory_of(row: asyncpg.Record) -> AgentMemory:
    refs, _ = parse_stored_refs(row["subject_refs"])  # the write path serves a malformed chain too
    return AgentMemory(
        id=row["id"],
        organization_id=row["organization_id"],
        definition_id=row["definition_id"],
        scope=row["scope"],
        user_id=row["user_id"],
        subject_key=row["subject_key"],
        text=row["text"],
        subject_refs=refs,
        proposed_by_run_id=row["proposed_by_run_id"],
        supersedes_id=row["supersedes_id"],
        forgotten_at=row["forgotten_at"],
        created_at=row["created_at"],
    )


async def head(
    tenant: TenantConnection, definition_id: UUID, scope: Scope, owner: UUID, subject_key: str
) -> AgentMemory | None:
    row = await tenant.fetchrow(HEAD, definition_id, scope, owner, subject_key)
    return None if row is None else memory_of(row)


async def head_by_id(tenant: TenantConnection, memory_id: UUID) -> AgentMemory | None:
    row = await tenant.fetchrow(HEAD_BY_ID, memory_id)
    return None if row is None else memory_of(row)


async def append(
    tenant: TenantConnection,
    *,
    definition_id: UUID,
    scope: Scope,
    user_id: UUID | None,
    subject_key: str,
    text: str,
    subject_refs: list[MemorySubjectRef],
    supersedes_id: UUID | None,
    run_id: UUID | None,
) -> AgentMemory | None:
    """The appended revision, or ``None`` when another writer attached to ``supersedes_id``
    (or rooted the chain) first."""
    refs = json.dumps([ref.model_dump(exclude_none=True) for ref in subject_refs])
    row = await tenant.fetchrow(
        APPEND, definition_id, scope, user_id, subject_key, text, refs, supersedes_id, run_id
    )
    return None if row is None else memory_of(row)


async def tombstone(
    tenant: TenantConnection, memory_id: UUID, run_id: UUID | None
) -> AgentMemory | None:
    """The tombstone appended after ``memory_id``, or ``None`` when another writer attached to
    it first."""
    row = await tenant.fetchrow(TOMBSTONE, memory_id, run_id)
    return None if row is None else memory_of(row)


async def claim(tenant: TenantConnection, key: str, fingerprint: str, operation: str) -> bool:
    return await tenant.fetchval(CLAIM, key, fingerprint, operation) is not None


async def journal(tenant: TenantConnection, key: str) -> dict[str, Any]:
    row = await tenant.fetchrow(JOURNAL, key)
    if row is None:  # the claim conflicted, so the row exists in this scope
        raise LookupError(f"no journal row for idempotency key {key!r}")
    return dict(row)


async def record(
    tenant: TenantConnection,
    key: str,
    outcome: Change | None,
    refusal: Refusal | None,
    memory_id: UUID | None,
) -> None:
    await tenant.execute(
        RECORD,
        key,
        "refused" if refusal is not None else outcome,
        None if refusal is None else refusal.reason,
        None if refusal is None else refusal.message[:2_000],
        memory_id,
    )


async def by_id(tenant: TenantConnection, memory_id: UUID) -> AgentMemory | None:
    row = await tenant.fetchrow(BY_ID, memory_id)
    return None if row is None else memory_of(row)
