"""What a memory write takes and answers, and the stored revision.

Strict where a model writes: an unknown field (``subject_key``, which the service makes) is
invalid input, never ignored; a key part is text that is not blank (every character
``str.isspace()`` calls whitespace, CLARIFICATIONS 2) and holds no ``:`` and no NUL byte, as the
table's CHECK says (migration 00009) and the read path's parser says again.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Literal, Self
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from contextcore.models import StorableText

NAMESPACES = ("observation.", "preference.")
"""The memory attribute namespaces: an application field name never carries either prefix, so a
memory cannot write an application-owned attribute's key."""
MAX_TEXT_CHARS = 4_000


def not_blank(text: str) -> bool:
    """Whether ``text`` holds a character that is not white space (``str.isspace`` is false
    for the empty string)."""
    return text != "" and not text.isspace()


def _key_part(text: str) -> str:
    if not not_blank(text):
        raise ValueError("is blank")
    if ":" in text:
        raise ValueError("holds ':', the subject key's delimiter")
    return text


def _text(text: str) -> str:
    if not not_blank(text):
        raise ValueError("is blank")
    return text


KeyPart = Annotated[StorableText, Field(min_length=1, max_length=200), AfterValidator(_key_part)]
MemoryText = Annotated[
    StorableText, Field(min_length=1, max_length=MAX_TEXT_CHARS), AfterValidator(_text)
]
Scope = Literal["user", "organization"]


class MemorySubjectRef(BaseModel):
    """The row a memory is about. ``label`` joins no key, so it may hold a colon."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: KeyPart
    id: KeyPart
    label: Annotated[StorableText, Field(max_length=500)] | None = None


class MemoryCandidate(BaseModel):
    """What ``memory.remember`` asks to store. At most one subject ref (V1): with two, the
    service would have to choose one without a rule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope: Scope
    attribute: KeyPart
    """``observation.<name>`` or ``preference.<name>``; another namespace is refused
    (``namespace``), not invalid."""
    text: MemoryText
    subject_refs: Annotated[list[MemorySubjectRef], Field(max_length=1)] = Field(
        default_factory=list
    )


class Invoker(BaseModel):
    """Who calls: the organization, the agent definition that owns the memory, exactly one of a
    user or a trigger, the run, and whether the caller is a workflow node (refused: only an
    agent definition owns memory)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    organization_id: UUID
    definition_id: UUID
    user_id: UUID | None = None
    trigger_id: UUID | None = None
    run_id: UUID | None = None
    workflow_node: StrictBool = False

    @model_validator(mode="after")
    def _one_actor(self) -> Self:
        if (self.user_id is None) == (self.trigger_id is None):
            raise ValueError("a principal is exactly one of a user or a trigger")
        return self


class AgentMemory(BaseModel):
    """One stored revision; a tombstone has no text and carries ``forgotten_at``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: UUID
    organization_id: UUID
    definition_id: UUID
    scope: Scope
    user_id: UUID | None
    subject_key: str
    text: str | None
    subject_refs: list[MemorySubjectRef]
    proposed_by_run_id: UUID | None
    supersedes_id: UUID | None
    forgotten_at: datetime | None
    created_at: datetime


RefusalReason = Literal[
    "namespace",  # the attribute is not observation.* or preference.*
    "trigger_user_scope",  # a trigger has no user, so it writes organization scope only
    "duplicate",  # the same text is live under this key: nothing changed
    "not_live",  # forget names an old revision, a tombstone or no memory of this organization
    "not_owner",  # forget names a memory of another definition or another user
    "workflow_node",  # a workflow tool node cannot write memory
    "invalid_input",  # the call does not validate, or reuses an idempotency key for another call
    # the service gave up on the call (it kept failing, or took its process down): it may have
    # been applied or not; the same call again, with its idempotency key, answers which
    "not_handled",
]
Change = Literal["created", "superseded", "revived", "forgotten"]


class Written(BaseModel):
    """The revision the call appended: a new chain (``created``), a new text after a live head
    (``superseded``), a text after a tombstone (``revived``), or a tombstone (``forgotten``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    change: Change
    memory: AgentMemory
    replayed: bool = False
    """Answered from the journal: an earlier call with this idempotency key appended it."""
    chain_length: int | None = None
    """The chain's revisions with this one (a tombstone counts); ``None`` for a replay."""


class Refusal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: RefusalReason
    message: str
    replayed: bool = False
    journaled: bool = True
    """Whether the journal holds this answer under the call's key. It does not for a key reused
    for another call (the key's row is the first call's), a key whose write was erased, or a
    call the database refused: those are counted apart (``memory_refusals``)."""


Answer = Written | Refusal


def parse_stored_refs(raw: object) -> tuple[list[MemorySubjectRef], int]:
    """The well-formed elements of a stored ``subject_refs`` value, and how many were refused.

    Each element is read alone: a key it does not know is ignored, and an element that is not
    an object or whose ``kind`` or ``id`` breaks the key-part rules is refused. The read path drops
    a memory with any refused element (an unfiltered memory would reach every member of the
    tenant); the write path keeps serving its chain.
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return [], 1
    if not isinstance(raw, list):
        return [], 1
    kept: list[MemorySubjectRef] = []
    refused = 0
    for element in raw:
        if not isinstance(element, dict):
            refused += 1
            continue
        known = {k: v for k, v in element.items() if k in MemorySubjectRef.model_fields}
        try:
            kept.append(MemorySubjectRef.model_validate(known))
        except ValidationError:
            refused += 1
    return kept, refused


def names_the_scope_owner(
    ref: MemorySubjectRef, scope: str, organization_id: UUID, user_id: UUID | None
) -> bool:
    """Whether ``ref`` names its memory's scope owner itself: kind ``organization`` with the
    organization, in organization scope; kind ``user`` with the user, in user scope (any
    spelling of the UUID).

    Such a ref means the same as no ref (CLARIFICATIONS 16, and item 8 makes the same key): the
    write path drops it and the read path treats a stored one the same way. No resolver owns
    these two kinds, so before, a memory written with one was dropped at every read
    (``unknown_kind``), the revision it superseded with it. Any other ref of the two kinds is
    refused (:data:`OWNER_KINDS`)."""
    try:
        named = UUID(ref.id)
    except ValueError:
        return False
    if scope == "organization":
        return ref.kind == "organization" and named == organization_id
    return ref.kind == "user" and user_id is not None and named == user_id


OWNER_KINDS = ("organization", "user")
"""Ref kinds that name a scope owner: no resolver owns them. A ref of one of them that is not
the memory's own scope owner (a user named in organization scope, another organization) is
refused as ``invalid_input``: it would be dropped at every read, and a ref naming the asking
user in organization scope is not the same as no ref (that would make a user's fact visible to
the whole organization under the organization's key)."""
