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
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, RootModel

from contextcore.memory.models import (
    AgentMemory,
    Answer,
    Change,
    Invoker,
    MemoryCandidate,
    RefusalReason,
    Written,
)
from schemas.envelope import Envelope

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

    @classmethod
    def of(cls, correlation_id: str, answer: Answer) -> MemoryAnswerV1:
        if isinstance(answer, Written):
            return cls(
                correlation_id=correlation_id,
                status="written",
                change=answer.change,
                memory=answer.memory,
            )
        return cls(
            correlation_id=correlation_id,
            status="refused",
            reason=answer.reason,
            message=answer.message,
        )
