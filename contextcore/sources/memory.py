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

from contextcore.memory.refs import DropReason, drop_reason, stored_subject
from contextcore.refs import parse_uuid
from contextcore.sources.common import NoOptions
from contextcore.storage.application import resolve_refs
from contextcore.storage.tenancy import ScopedRead, TenantDatabase
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
