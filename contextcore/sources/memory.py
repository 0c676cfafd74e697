"""``memory``: the live memories of the subject, newest first, each behind the tenant guard.

* Filters (through the tenancy layer and again in SQL): the organization; the user chain rule
  (organization memories, and the asking user's own user memories; a trigger has no user and
  reads organization memories alone); the definition, except that a subject with no definition
  (a front-door turn) reads every definition of the organization: the one filter it drops.
* Order ``(created_at DESC, id DESC)``: the id breaks a timestamp tie, so the cap is
  deterministic. ``spec.limit`` caps the database read; 0 reads nothing; ``None`` reads 20.
* Old revisions and tombstones never come back: the read is of ``live_memories``.
* The tenant guard (CLARIFICATIONS 9): a memory that names a subject keeps it only if the
  subject resolves for this organization through the application resolvers, one query per ref
  kind. A ref of a kind no resolver owns, another tenant's row, a deleted row or a row that
  never existed drops the memory; so does a malformed stored ref, which costs only its own
  memory (counted through ``on_drop`` and logged). No second query refills the answer. A ref
  naming the memory's own scope owner means no ref (CLARIFICATIONS 16).
* A user memory is a ``personal_memory`` item, an organization memory a ``memory`` item
  (CLARIFICATIONS 7), each with the memory's subject key, cited as ``memory:<id>``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pydantic import BaseModel

from contextcore.memory.refs import names_the_scope_owner, parse_stored_refs
from contextcore.refs import parse_uuid
from contextcore.sources.application import PROJECTIONS, READ
from contextcore.sources.common import NoOptions
from contextcore.storage.tenancy import ScopedRead, TenantConnection, TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef
from schemas.memory import MemorySubjectRef

log = logging.getLogger("contextcore.sources.memory")

DEFAULT_LIMIT = 20

LIVE = ScopedRead(
    "memory.live",
    "-- memory.live: the live memories of the subject's definition (null: every definition, a\n"
    "-- front-door turn), newest first; $2 the user (null: a trigger reads organization scope\n"
    "-- only); $3 caps them (00033)\n"
    "SELECT id, scope, subject_key, text, subject_refs, created_at\n"
    "FROM contextcore_read_memories($1, $2, $3, $4)",
)

DropReason = str
"""``malformed_ref`` (a stored element the parser refuses), ``unknown_kind`` (no resolver owns
it), ``unresolved_ref`` (not a row of this organization: another tenant's, deleted, missing)."""


@dataclass(frozen=True)
class _Row:
    id: UUID
    scope: str
    subject_key: str
    text: str
    ref: MemorySubjectRef | None
    created_at: datetime


class MemoryContextSource:
    name = "memory"
    options_schema: type[BaseModel] = NoOptions

    def __init__(
        self, database: TenantDatabase, *, on_drop: Callable[[DropReason], None] | None = None
    ) -> None:
        self.database = database
        self.on_drop = on_drop

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        limit = DEFAULT_LIMIT if spec.limit is None else spec.limit
        if limit == 0:
            return []
        subject = request.subject
        records = await self.database.read(
            LIVE, subject.organization_id, subject.user_id, limit, subject.definition_id
        )
        rows: list[_Row] = []
        for record in records:
            ref, malformed = stored_subject(  # a user memory's user is the asking user
                record["subject_refs"],
                record["scope"],
                subject.organization_id,
                subject.user_id,
            )
            if malformed:
                self._drop("malformed_ref", record["id"])
                continue
            rows.append(
                _Row(
                    record["id"],
                    record["scope"],
                    record["subject_key"],
                    record["text"],
                    ref,
                    record["created_at"],
                )
            )
        refs = [row.ref for row in rows if row.ref is not None]
        resolved = await resolve_refs(self.database, subject.organization_id, refs)
        items: list[ContextItem] = []
        for row in rows:
            if (reason := drop_reason(row.ref, resolved)) is not None:
                self._drop(reason, row.id)
                continue
            body_refs = (
                [ResourceRef(kind=row.ref.kind, id=str(parse_uuid(row.ref.id)))]
                if row.ref is not None
                else []
            )
            items.append(
                ContextItem(
                    source=self.name,
                    kind="personal_memory" if row.scope == "user" else "memory",
                    title=row.subject_key.rsplit(":", 1)[-1],
                    body=row.text,
                    subject_key=row.subject_key,
                    ref=ResourceRef(kind="memory", id=str(row.id)),
                    body_refs=body_refs,
                    recorded_at=row.created_at,
                )
            )
        return items

    def _drop(self, reason: DropReason, memory_id: UUID) -> None:
        log.warning("memory %s dropped from the brief: %s", memory_id, reason)
        if self.on_drop is not None:
            self.on_drop(reason)


def stored_subject(
    raw: object, scope: str, organization_id: UUID, user_id: UUID | None
) -> tuple[MemorySubjectRef | None, bool]:
    """The subject a stored ``subject_refs`` value names (``None``: the memory is about its
    scope's owner), and whether the value is malformed (the memory is then dropped). A ref naming
    the memory's own scope owner means no ref (CLARIFICATIONS 16); ``user_id`` is the memory's
    user (user scope)."""
    refs, refused = parse_stored_refs(raw)
    if refused or len(refs) > 1:  # V1 resolves one subject per memory
        return None, True
    ref = refs[0] if refs else None
    if ref is not None and names_the_scope_owner(ref, scope, organization_id, user_id):
        return None, False  # stored before the write path dropped it
    return ref, False


def _wanted(refs: list[MemorySubjectRef]) -> list[list[UUID]] | None:
    """The ids to resolve, one array per kind the application source resolves (``None``:
    nothing to resolve)."""
    wanted: dict[str, set[UUID]] = {}
    for ref in refs:
        if ref.kind in PROJECTIONS and (row_id := parse_uuid(ref.id)) is not None:
            wanted.setdefault(ref.kind, set()).add(row_id)
    if not wanted:
        return None
    return [sorted(wanted.get(kind, ())) for kind in PROJECTIONS]


async def resolve(tenant: TenantConnection, refs: list[MemorySubjectRef]) -> set[tuple[str, UUID]]:
    """The ``(kind, id)`` of ``refs`` that name a row of this organization: one statement for
    every kind the application source resolves, never one per memory (inside a scope's
    transaction: ``contextcore memory health``)."""
    arrays = _wanted(refs)
    if arrays is None:
        return set()
    return {(found["kind"], found["id"]) for found in await tenant.read(READ, *arrays)}


async def resolve_refs(
    database: TenantDatabase, organization_id: UUID, refs: list[MemorySubjectRef]
) -> set[tuple[str, UUID]]:
    """:func:`resolve` as one scoped read of its own (the build path)."""
    arrays = _wanted(refs)
    if arrays is None:
        return set()
    rows = await database.read(READ, organization_id, *arrays)
    return {(found["kind"], found["id"]) for found in rows}


def drop_reason(ref: MemorySubjectRef | None, resolved: set[tuple[str, UUID]]) -> DropReason | None:
    """Why the tenant guard drops a memory about ``ref`` (``None``: it is kept)."""
    if ref is None:
        return None
    if ref.kind not in PROJECTIONS:
        return "unknown_kind"
    row_id = parse_uuid(ref.id)
    if row_id is None or (ref.kind, row_id) not in resolved:
        return "unresolved_ref"
    return None
