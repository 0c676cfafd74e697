"""The memory write path's SQL: one call of ``memory_apply`` (migration 00011) per batch, and
:class:`PostgresMemoryJournal`, the service's journal on it.

The function scopes each write to its organization before it touches a row, so it runs in a
:meth:`~contextcore.storage.tenancy.TenantDatabase.writing_each` transaction; row-level
security repeats every organization filter it writes. Nothing here updates a revision: each
state change is one insert.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg

from contextcore.memory.refs import parse_stored_refs
from contextcore.memory.service import (
    ConstraintBroken,
    Erasing,
    JournalRefused,
    LostTheRace,
    Write,
    WrittenConcurrently,
)
from contextcore.storage.tenancy import Connection, TenantDatabase, TenantQuery
from schemas.memory import AgentMemory, Answer, Refusal, Written

# memory.apply: the writes of one batch, in order; one answer per write with the revision it
# names (the appended one, or the journal's for a replay) and the chain's length (00026). With
# $2 false, a write of an organization being erased is answered 'erasing', unapplied (00037).
# SQLSTATE CC001: a writer lost the race for a head 32 times; CC002: a writer of the same
# idempotency key committed meanwhile.
APPLY = """
-- memory.apply (migrations 00011, 00037)
SELECT ordinal, outcome, reason, message, replayed, organization_id, id, definition_id, scope,
       user_id, subject_key, text, subject_refs, proposed_by_run_id, supersedes_id,
       forgotten_at, created_at, chain_length
FROM memory_apply($1::jsonb, $2::boolean)
"""

LOST_THE_RACE = "CC001"
WRITTEN_CONCURRENTLY = "CC002"


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


def answer_of(row: asyncpg.Record) -> Answer | Erasing:
    if row["outcome"] == "erasing":
        return Erasing()
    if row["outcome"] == "refused":
        return Refusal(reason=row["reason"], message=row["message"] or "", replayed=row["replayed"])
    if row["id"] is None:  # the journal's foreign key keeps the revision: only a bug gets here
        raise LookupError(f"write {row['ordinal']} answered {row['outcome']} with no revision")
    return Written(
        change=row["outcome"],
        memory=memory_of(row),
        replayed=row["replayed"],
        chain_length=row["chain_length"],
    )


async def apply(
    conn: Connection, writes: list[dict[str, Any]], *, wait: bool = True
) -> list[Answer | Erasing]:
    """The answers to ``writes``, in order, from one statement in the caller's transaction;
    without ``wait``, :class:`Erasing` for each write whose organization is being erased."""
    rows = await conn.fetch(APPLY, json.dumps(writes), wait)
    if [row["ordinal"] for row in rows] != list(range(1, len(writes) + 1)):
        raise LookupError(f"memory_apply answered {len(rows)} of {len(writes)} writes")
    return [answer_of(row) for row in rows]


COUNT_REFUSAL = TenantQuery(
    "memory.count_refusal",
    """
-- memory.count_refusal: one more invalid_input refusal the journal holds no row for (00028)
INSERT INTO memory_refusals AS r (organization_id, day, operation, reason, calls)
VALUES ($1, current_date, $2, 'invalid_input', 1)
ON CONFLICT (organization_id, day, operation, reason) DO UPDATE SET calls = r.calls + 1
""",
)


class PostgresMemoryJournal:
    """The :class:`~contextcore.memory.service.MemoryJournal` on PostgreSQL: a batch is one
    :meth:`~contextcore.storage.tenancy.TenantDatabase.writing_each` transaction and one
    statement. PostgreSQL's refusals become the port's errors; an unreachable database stays
    what the tenancy layer raises."""

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
        try:
            async with self.database.writing_each() as conn:
                return await apply(conn, writes, wait=wait)
        except asyncpg.IntegrityConstraintViolationError as error:
            constraint = getattr(error, "constraint_name", None) or type(error).__name__
            if isinstance(error, asyncpg.ForeignKeyViolationError) and constraint.endswith(
                "_organization_id_fkey"  # every organization reference, named by PostgreSQL
            ):
                raise ConstraintBroken(constraint, "no such organization") from error
            raise ConstraintBroken(constraint) from error
        except asyncpg.PostgresError as error:
            if error.sqlstate == LOST_THE_RACE:
                raise LostTheRace(str(error), error.sqlstate) from error
            if error.sqlstate == WRITTEN_CONCURRENTLY:
                raise WrittenConcurrently(str(error), error.sqlstate) from error
            raise JournalRefused(f"{type(error).__name__}: {error}", error.sqlstate) from error

    async def count_refusal(self, organization_id: UUID, operation: str) -> None:
        async with self.database.writing(organization_id) as tenant:
            await tenant.execute(COUNT_REFUSAL, operation)
