"""``memory_apply``'s answers on a dict: the memory journal (contextcore/memory/service.py) the
memory consumer's in-memory run uses. It keeps the rules a caller sees (a key answered once and
replayed after, a chain's head, duplicate, forget) and none of the database's others (locks,
constraints, erasure); the same behaviour suite runs against PostgreSQL, so where this strays
from ``memory_apply`` a test of tests/behaviour/ fails on one rig and not the other."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from contextcore.memory.service import Erasing, Write
from schemas.memory import AgentMemory, Answer, Refusal, Written


class DictMemoryJournal:
    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[str, Answer]] = {}
        self.chains: dict[tuple[str, ...], list[AgentMemory]] = {}
        self.refusals: list[tuple[UUID, str]] = []

    async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
        return [self._one(write) for write in writes]

    async def count_refusal(self, organization_id: UUID, operation: str) -> None:
        self.refusals.append((organization_id, operation))

    def _one(self, write: Write) -> Answer:
        key = (write["organization_id"], write["idempotency_key"])
        known = self.answers.get(key)
        if known is not None:
            fingerprint, answer = known
            if fingerprint != write["request_sha256"]:
                return Refusal(
                    reason="invalid_input",
                    message="the idempotency key was used for another call",
                    journaled=False,
                )
            return answer.model_copy(update={"replayed": True, "chain_length": None})
        answer = self._decide(write)
        self.answers[key] = (write["request_sha256"], answer)
        return answer

    def _decide(self, write: Write) -> Answer:
        if "refusal" in write:
            return Refusal(**write["refusal"])
        if write["operation"] == "forget":
            return self._forget(write)
        chain_key = (
            write["organization_id"],
            write["definition_id"],
            write["scope_owner_id"],
            write["subject_key"],
        )
        chain = self.chains.setdefault(chain_key, [])
        head = chain[-1] if chain else None
        if head is not None and head.forgotten_at is None and head.text == write["text"]:
            return Refusal(reason="duplicate", message="the same text is live under this key")
        change = "created" if head is None else "revived" if head.forgotten_at else "superseded"
        memory = _revision(write, head, text=write["text"], refs=write["subject_refs"])
        chain.append(memory)
        return Written(change=change, memory=memory, chain_length=len(chain))

    def _forget(self, write: Write) -> Answer:
        for chain in self.chains.values():
            head = chain[-1]
            if str(head.id) == write["memory_id"] and head.forgotten_at is None:
                if str(head.organization_id) != write["organization_id"]:
                    break
                if str(head.definition_id) != write["definition_id"] or (
                    head.user_id is not None and str(head.user_id) != write["user_id"]
                ):
                    return Refusal(reason="not_owner", message="another owner's memory")
                tombstone = _revision(write, head, text=None, refs=[], forgotten=True)
                chain.append(tombstone)
                return Written(change="forgotten", memory=tombstone, chain_length=len(chain))
        return Refusal(reason="not_live", message="no live memory of this organization")


def _revision(
    write: Write,
    head: AgentMemory | None,
    *,
    text: str | None,
    refs: list[Any],
    forgotten: bool = False,
) -> AgentMemory:
    now = datetime.now(UTC)
    return AgentMemory(
        id=uuid.uuid4(),
        organization_id=write["organization_id"],
        definition_id=write["definition_id"],
        scope=head.scope if head is not None else write["scope"],
        user_id=head.user_id if head is not None else write["user_id"],
        subject_key=head.subject_key if head is not None else write["subject_key"],
        text=text,
        subject_refs=refs,
        proposed_by_run_id=write["run_id"],
        supersedes_id=None if head is None else head.id,
        forgotten_at=now if forgotten else None,
        created_at=now,
    )
