"""``MemoryService``: the one writer of agent memory (``memory.remember``, ``memory.forget``).

Every call is one transaction in the caller's organization, and in it:

1. the journal claims the idempotency key (``memory_writes``). A key used before is answered
   from the journal: the same answer, no second row, also after a crash between the insert and
   the commit (then neither the claim nor the revision exists, and the redelivery applies it).
2. the rules decide, in this order: a workflow node is refused; an attribute outside the
   ``observation.`` and ``preference.`` namespaces is refused; a trigger cannot write user scope.
3. the writer reads the chain's exact head and appends one revision after it. Identical text
   under a live head is a refusal (``duplicate``); different text supersedes; text after a
   tombstone revives the chain. Two writers can read one head, but only one can attach to it
   (``memories_one_child``, ``memories_one_root``): the loser's insert returns nothing, and it
   reads the new head and decides again. Never two children, never half a supersede.
4. the journal records the answer.

A forget names a current live revision (else ``not_live``) of the caller's definition, and of
the caller's user for a user memory (else ``not_owner``), and appends a tombstone after it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg

from contextcore.errors import ContextcoreError
from contextcore.memory import store
from contextcore.memory.models import (
    NAMESPACES,
    AgentMemory,
    Answer,
    Invoker,
    MemoryCandidate,
    Refusal,
    Written,
)
from contextcore.models import ResourceRef, make_subject_key
from contextcore.sources.common import parse_uuid
from contextcore.storage.tenancy import TenantConnection, TenantDatabase

MAX_ATTEMPTS = 32
"""How many times a writer may lose the race for one head in one call. Each loss means another
write of the same chain committed, so the bound is never reached under a sane load."""


class MemoryContention(ContextcoreError):
    """A writer lost the race for one chain's head :data:`MAX_ATTEMPTS` times in one call."""


def subject_key(invoker: Invoker, candidate: MemoryCandidate) -> str:
    """``<kind>:<id>:<attribute>`` from the one subject ref, or from the scope owner
    (``organization:<id>`` / ``user:<id>``) when there is none (CLARIFICATIONS 8)."""
    if candidate.subject_refs:
        subject = candidate.subject_refs[0]
        ref = ResourceRef(kind=subject.kind, id=subject.id)
    elif candidate.scope == "user":
        ref = ResourceRef(kind="user", id=str(invoker.user_id))
    else:
        ref = ResourceRef(kind="organization", id=str(invoker.organization_id))
    key = make_subject_key(ref, candidate.attribute)
    assert key is not None  # both parts are given
    return key


def canonical(candidate: MemoryCandidate) -> MemoryCandidate:
    """The candidate with a UUID-shaped ref id in its one canonical form (lower case, hyphens),
    as the resolvers return it: ``6F9619FF…`` and ``6f9619ff-…`` name one row, so they must
    make one subject key, one chain and one ``duplicate``."""
    refs = []
    for ref in candidate.subject_refs:
        row_id = parse_uuid(ref.id)
        refs.append(ref if row_id is None else ref.model_copy(update={"id": str(row_id)}))
    return candidate.model_copy(update={"subject_refs": refs})


def fingerprint(operation: str, invoker: Invoker, payload: object) -> str:
    """What one call asked, canonically: a reused idempotency key with another call is told
    apart from a redelivery."""
    canonical = json.dumps(
        [operation, invoker.model_dump(mode="json"), payload], sort_keys=True, ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class MemoryService:
    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def remember(
        self, invoker: Invoker, candidate: MemoryCandidate, idempotency_key: str
    ) -> Answer:
        payload = candidate.model_dump(mode="json")
        return await self._once(
            invoker,
            idempotency_key,
            "remember",
            fingerprint("remember", invoker, payload),
            lambda tenant: self._remember(tenant, invoker, candidate),
        )

    async def forget(self, invoker: Invoker, memory_id: UUID, idempotency_key: str) -> Answer:
        return await self._once(
            invoker,
            idempotency_key,
            "forget",
            fingerprint("forget", invoker, str(memory_id)),
            lambda tenant: self._forget(tenant, invoker, memory_id),
        )

    async def _once(
        self,
        invoker: Invoker,
        key: str,
        operation: str,
        digest: str,
        apply: Callable[[TenantConnection], Awaitable[Answer]],
    ) -> Answer:
        try:
            async with self.database.writing(invoker.organization_id) as tenant:
                if not await store.claim(tenant, key, digest, operation):
                    return await _replay(tenant, key, digest)
                answer = await apply(tenant)
                if isinstance(answer, Written):
                    await store.record(tenant, key, answer.change, None, answer.memory.id)
                else:
                    await store.record(tenant, key, None, answer, None)
                return answer
        except asyncpg.IntegrityConstraintViolationError as error:
            # The database refuses what no retry will change: an organization that does not
            # exist, a value past a constraint. Nothing was written, so nothing is journaled.
            constraint = getattr(error, "constraint_name", None) or type(error).__name__
            return Refusal(
                reason="invalid_input", message=f"the database refused the write: {constraint}"
            )

    async def _remember(
        self, tenant: TenantConnection, invoker: Invoker, candidate: MemoryCandidate
    ) -> Answer:
        if invoker.workflow_node:
            return Refusal(
                reason="workflow_node", message="a workflow tool node cannot write memory"
            )
        if not candidate.attribute.startswith(NAMESPACES) or candidate.attribute in NAMESPACES:
            return Refusal(
                reason="namespace",
                message=f"attribute {candidate.attribute!r} is not observation.<name> "
                "or preference.<name>",
            )
        if candidate.scope == "user" and invoker.user_id is None:
            return Refusal(
                reason="trigger_user_scope",
                message="a trigger has no user: organization scope only",
            )
        candidate = canonical(candidate)
        key = subject_key(invoker, candidate)
        user_id = invoker.user_id if candidate.scope == "user" else None
        owner = user_id if user_id is not None else invoker.organization_id
        for _ in range(MAX_ATTEMPTS):
            current = await store.head(tenant, invoker.definition_id, candidate.scope, owner, key)
            if current is not None and current.text == candidate.text:
                return Refusal(
                    reason="duplicate",
                    message=f"memory {current.id} already says this under {key}",
                )
            appended = await store.append(
                tenant,
                definition_id=invoker.definition_id,
                scope=candidate.scope,
                user_id=user_id,
                subject_key=key,
                text=candidate.text,
                subject_refs=candidate.subject_refs,
                supersedes_id=None if current is None else current.id,
                run_id=invoker.run_id,
            )
            if appended is not None:
                if current is None:
                    return Written(change="created", memory=appended)
                change = "revived" if current.forgotten_at is not None else "superseded"
                return Written(change=change, memory=appended)
        raise MemoryContention(f"lost the race for the head of {key} {MAX_ATTEMPTS} times")

    async def _forget(self, tenant: TenantConnection, invoker: Invoker, memory_id: UUID) -> Answer:
        if invoker.workflow_node:
            return Refusal(
                reason="workflow_node", message="a workflow tool node cannot write memory"
            )
        for _ in range(MAX_ATTEMPTS):
            current = await store.head_by_id(tenant, memory_id)
            if current is None or current.forgotten_at is not None:
                return Refusal(
                    reason="not_live",
                    message=f"{memory_id} is not the current live revision of a memory",
                )
            if not _owns(invoker, current):
                return Refusal(
                    reason="not_owner",
                    message=f"memory {memory_id} belongs to another definition or user",
                )
            tombstone = await store.tombstone(tenant, current.id, invoker.run_id)
            if tombstone is not None:
                return Written(change="forgotten", memory=tombstone)
        raise MemoryContention(f"lost the race to forget {memory_id} {MAX_ATTEMPTS} times")


def _owns(invoker: Invoker, memory: AgentMemory) -> bool:
    if memory.definition_id != invoker.definition_id:
        return False
    return memory.scope == "organization" or memory.user_id == invoker.user_id


async def _replay(tenant: TenantConnection, key: str, digest: str) -> Answer:
    row = await store.journal(tenant, key)
    if row["request_sha256"] != digest:
        return Refusal(
            reason="invalid_input",
            message=f"idempotency key {key!r} was used for another call",
        )
    if row["outcome"] == "refused":
        return Refusal(reason=row["reason"], message=row["message"] or "", replayed=True)
    memory = await store.by_id(tenant, row["memory_id"])
    if memory is None:  # the journal's foreign key keeps the revision: only a bug gets here
        raise LookupError(f"the journal of {key!r} names a revision that does not exist")
    return Written(change=row["outcome"], memory=memory, replayed=True)
