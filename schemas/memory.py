"""The memory-write topic: ``memory.remember`` and ``memory.forget`` calls, and their answers.

Wire shape (JSON)::

    {"schema_version": 1, "action": "remember", "correlation_id": "…", "reply_to": "topic",
     "idempotency_key": "…",
     "principal": {"organization_id": "uuid", "definition_id": "uuid", "user_id": "uuid",
                   "run_id": "uuid", "workflow_node": false},
     "memory": {"scope": "user", "attribute": "preference.language",
                "text": "Write in British English", "subject_refs": []}}

    {"schema_version": 1, "action": "forget", …, "memory_id": "uuid"}

Strict: an unknown field anywhere (``subject_key`` above all: the service makes the key) is
answered ``refused`` with reason ``invalid_input``, never ignored. Every answer goes to
``reply_to`` with the ``correlation_id``: ``written`` with the revision and what it changed, or
``refused`` with a machine-readable reason. The same ``idempotency_key`` twice is answered the
same, and writes one row.

The types of a call and its answer come first, the envelopes after them. A key part is text
that is not blank (every character ``str.isspace()`` calls whitespace, CLARIFICATIONS 2) and
holds no ``:`` and no NUL byte, as the table's CHECK says (migration 00009) and the read path's
parser says again (contextcore/memory/refs.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    model_validator,
)

from schemas.context import StorableText
from schemas.envelope import Envelope
from schemas.position import Position

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
    # the organization holds its quota memory_revisions (an operator's setting): not journaled,
    # so the same call is applied once the quota is raised or memories are forgotten
    "quota",
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


SCHEMA_VERSION = 1
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$")]


class RememberV1(Envelope):
    schema_version: Literal[1] = 1
    action: Literal["remember"]
    idempotency_key: IdempotencyKey
    principal: Invoker
    memory: MemoryCandidate


class ForgetV1(Envelope):
    schema_version: Literal[1] = 1
    action: Literal["forget"]
    idempotency_key: IdempotencyKey
    principal: Invoker
    memory_id: UUID


class MemoryWriteV1(RootModel[Annotated[RememberV1 | ForgetV1, Field(discriminator="action")]]):
    """What the memory-write topic carries."""


def parse_memory_write(data: Any) -> RememberV1 | ForgetV1:
    """Raises ValidationError."""
    return MemoryWriteV1.model_validate(data).root


class MemoryAnswerV1(BaseModel):
    """``written`` carries ``change`` and ``memory``; ``refused`` carries ``reason`` and
    ``message`` (and ``details`` for invalid input)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    correlation_id: str
    status: Literal["written", "refused"]
    change: Change | None = None
    memory: AgentMemory | None = None
    reason: RefusalReason | None = None
    message: str | None = None
    details: list[str] = Field(default_factory=list)
    position: Position | None = None
    """Where the database's log stood once the call was applied (or found applied, or
    refused on what is stored): name it as a build request's ``read_after`` and that build
    reads this state or a later one. Absent on an answer the database was not asked for."""

    @classmethod
    def of(
        cls, correlation_id: str, answer: Answer, *, position: str | None = None
    ) -> MemoryAnswerV1:
        if isinstance(answer, Written):
            return cls(
                correlation_id=correlation_id,
                status="written",
                change=answer.change,
                memory=answer.memory,
                position=position,
            )
        return cls(
            correlation_id=correlation_id,
            status="refused",
            reason=answer.reason,
            message=answer.message,
            position=position,
        )
