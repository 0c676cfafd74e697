"""Erasure: an operator removes the text of a person's memories and keeps the audit trail
(CLARIFICATIONS 15; migration 00025; docs/memory.md, "Erasure").

``memory.forget`` is the agent's act and keeps the text. :func:`erase` is the operator's, as the
schema owner: the text of every revision of the matched chains is removed (labels of refs too,
and the journal's request fingerprints), the structure stays, and a record says when, by which
login and what matched. A dry run (``apply=False``) says what would be erased and writes
nothing. After an erasure, ``VACUUM`` removes the old row versions that still hold the text from
the table files (:data:`VACUUM`, run outside the transaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID

import asyncpg

from contextcore.refs import parse_uuid
from schemas.memory import MemorySubjectRef

Selector = Literal["user", "subject", "memory"]

# memory.erase (migration 00025): as the owner; locks both tables for the transaction when $4
ERASE = """
-- memory.erase: the chains that match, and with $4 their erasure (migration 00025)
SELECT erasure_id, chains, revisions, journal_rows, memory_ids
FROM memory_erase($1, $2, $3, $4)
"""

# memory.vacuum: the old row versions that still hold erased text leave the table files
VACUUM = "VACUUM memories, memory_writes"


@dataclass(frozen=True)
class Erasure:
    erasure_id: UUID | None
    """The record's id; ``None`` on a dry run or when nothing matched."""
    chains: int
    revisions: int
    journal_rows: int
    memory_ids: tuple[UUID, ...]


def subject_selector(raw: str) -> str:
    """``KIND:ID`` as subject keys hold it: each part a key part (no ``:``, not blank), a
    UUID-shaped id in its canonical form, as the write path stores it. Raises ``ValueError``."""
    kind, colon, row_id = raw.partition(":")
    if not colon:
        raise ValueError(f"a subject is KIND:ID, not {raw!r}")
    ref = MemorySubjectRef(kind=kind, id=row_id)  # pydantic's ValidationError is a ValueError
    canonical = parse_uuid(ref.id)
    return f"{ref.kind}:{ref.id if canonical is None else canonical}"


async def erase(
    conn: asyncpg.Connection, organization: UUID, selector: Selector, selected: str, *, apply: bool
) -> Erasure:
    """What matches ``selector``/``selected`` in ``organization`` and, with ``apply``, its
    erasure, in one transaction. ``conn`` is the schema owner's (the only role that may)."""
    if selector == "subject":
        selected = subject_selector(selected)
    elif parse_uuid(selected) is None:
        raise ValueError(f"a {selector} is named by its UUID, not {selected!r}")
    # read committed: the match runs after the lock, and must see what committed before it
    async with conn.transaction(isolation="read_committed"):
        row = await conn.fetchrow(ERASE, organization, selector, selected, apply)
    assert row is not None  # the function returns one row
    erasure = Erasure(
        erasure_id=row["erasure_id"],
        chains=row["chains"],
        revisions=row["revisions"],
        journal_rows=row["journal_rows"],
        memory_ids=tuple(row["memory_ids"]),
    )
    if apply:  # also after a rerun that matched nothing: an earlier vacuum may have failed
        await conn.execute(VACUUM)
    return erasure
