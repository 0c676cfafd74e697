"""``MemoryService``: the one writer of agent memory (``memory.remember``, ``memory.forget``).

A call is decided in two places:

1. here, the rules that need no row, in this order: a workflow node is refused; an attribute
   outside the ``observation.`` and ``preference.`` namespaces is refused; a trigger cannot
   write user scope; a ref of an owner kind that is not the scope's owner is
   ``invalid_input``. Then the subject key (from the one subject ref, or the scope owner) and
   the request's fingerprint;
2. in the database, ``memory_apply`` (migration 00011), next to the rows: the journal's answer
   to a key used before (the same answer, no second row, also after a crash between the
   insert and the commit, when neither exists); the chain's exact head, then ``duplicate``,
   or one revision appended after it; for a forget, ``not_live`` / ``not_owner`` or a
   tombstone; then the journal row with the answer. Two writers can read one head, but only
   one can attach to it (``memories_one_child``, ``memories_one_root``): the loser reads the
   new head and decides again. Never two children, never half a supersede.

The service reaches the database through one port, :class:`MemoryJournal` (its adapter is
:class:`~contextcore.memory.adapters.store.PostgresMemoryJournal`), so its rules and its batching
have unit tests on an in-memory journal (tests/unit/test_memory_service.py).

Calls are applied in batches (group commit): a call waits while ``concurrency`` batches are in
the database, and the calls that gathered meanwhile go together, up to ``max_batch``, in one
transaction and one round trip. Alone, a call is a batch of one and waits for nothing. A batch
the database refuses (one write breaks a constraint, a deadlock) rolls back whole and its
writes are applied one by one, so one bad write costs only its own answer.

An operator's erasure holds its organization's writes until it commits (migration 00037), and
only those: a batch does not wait for it. The writes of an organization being erased come back
:class:`Erasing`, unapplied, and go to that organization's own lane, which applies them, in
batches, once the erasure is done (at most ``MAX_LANES`` lanes wait at once, each on one
connection). The other writes of the batch are answered at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from contextcore.memory.refs import OWNER_KINDS, names_the_scope_owner
from contextcore.refs import parse_uuid
from schemas.context import ResourceRef, make_subject_key
from schemas.errors import ContextcoreError
from schemas.memory import NAMESPACES, Answer, Invoker, MemoryCandidate, Refusal

log = logging.getLogger("contextcore.memory")


class MemoryContention(ContextcoreError):
    """A write lost the race for one chain's head 32 times in one call, or a writer of the same
    idempotency key committed while it ran. Nothing of it was written: the caller retries
    later (and then a replay answers it from the journal)."""


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


def canonical(invoker: Invoker, candidate: MemoryCandidate) -> MemoryCandidate:
    """The candidate with a UUID-shaped ref id in its one canonical form (lower case, hyphens),
    as the resolvers return it: ``6F9619FF…`` and ``6f9619ff-…`` name one row, so they must
    make one subject key, one chain and one ``duplicate``. A ref naming the memory's own scope
    owner is dropped: it means no ref (:func:`names_the_scope_owner`)."""
    refs = []
    for ref in candidate.subject_refs:
        if names_the_scope_owner(ref, candidate.scope, invoker.organization_id, invoker.user_id):
            continue
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


Write = dict[str, Any]
"""One call as ``memory_apply`` takes it (migration 00011)."""


class JournalRefused(ContextcoreError):
    """The journal refused a transaction whole (a deadlock, say): nothing of it was applied.
    ``sqlstate`` is the database's code for it, when it gave one (a command's exit status
    reads it: too many connections is "unavailable", not a refusal)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message)


class ConstraintBroken(JournalRefused):
    """A write breaks a rule no retry changes (an organization that does not exist, a value
    past a constraint). ``constraint`` names it for the logs; the message is what the caller
    is told, and never names the database's own objects."""

    def __init__(
        self, constraint: str, message: str = "the memory store refuses this write"
    ) -> None:
        self.constraint = constraint
        super().__init__(message)


class LostTheRace(JournalRefused):
    """A write lost the race for its chain's head too often (SQLSTATE CC001)."""


class WrittenConcurrently(JournalRefused):
    """A writer of the same idempotency key committed meanwhile (SQLSTATE CC002): the journal
    now holds its answer, so applying the write again replays it."""


@dataclass(frozen=True)
class Erasing:
    """A write not applied: an erasure of its organization is in progress (migration 00037)."""


class MemoryJournal(Protocol):
    """Where memory calls are applied and answered, next to the rows they decide on."""

    async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
        """One answer per write, in order, from one transaction: all of them, or none. With
        ``wait``, a write of an organization being erased waits for the erasure; without, it is
        :class:`Erasing`, and nothing of it is written.

        Raises:
            JournalRefused: the transaction was refused, nothing applied (the subclasses say
                why, when a caller can act on it); any other error: the journal is away.
        """
        ...

    async def count_refusal(self, organization_id: UUID, operation: str) -> None:
        """Count one ``invalid_input`` refusal the journal holds no row for."""
        ...


MAX_LANES = 4
"""Organizations whose set-aside writes wait for their erasure at once, each on a connection."""

Pending = tuple[Write, "asyncio.Future[Answer]"]


class MemoryService:
    def __init__(
        self, journal: MemoryJournal, *, max_batch: int = 64, concurrency: int = 2
    ) -> None:
        if max_batch < 1 or concurrency < 1:
            raise ValueError("a batch holds at least one write, and one batch at least runs")
        self.journal = journal
        self.max_batch = max_batch
        self.concurrency = concurrency
        self._queue: deque[Pending] = deque()
        self._draining = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._lanes: dict[str, deque[Pending]] = {}
        self._lane_slots = asyncio.Semaphore(MAX_LANES)

    async def remember(
        self, invoker: Invoker, candidate: MemoryCandidate, idempotency_key: str
    ) -> Answer:
        return await self._submit(remember_write(invoker, candidate, idempotency_key))

    async def forget(self, invoker: Invoker, memory_id: UUID, idempotency_key: str) -> Answer:
        return await self._submit(forget_write(invoker, memory_id, idempotency_key))

    async def count_unjournaled_refusal(self, organization_id: UUID, operation: str) -> None:
        """Count an ``invalid_input`` refusal the journal holds no row for (a record that does
        not validate, a reused key, a call the database refused), for ``contextcore memory
        health``. Raises what the database raises: an organization that does not exist."""
        await self.journal.count_refusal(organization_id, operation)

    # ------------------------------------------------------------------ group commit

    async def _submit(self, write: Write) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        # a caller that was cancelled never reads its future: retrieve the exception here, so
        # asyncio does not log it as lost
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._queue.append((write, future))
        if self._draining < self.concurrency:
            self._draining += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # a cancelled caller (a handler timeout) leaves its write to the batch: it commits or
        # not, and the redelivered call is answered from the journal either way
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        try:
            await self._apply_queue(self._queue, wait=False)
        finally:
            self._draining -= 1

    async def _apply_queue(self, queue: deque[Pending], *, wait: bool) -> None:
        """Apply batches until ``queue`` is empty. The last look at the queue and the caller's
        count going down happen with no await between them, so no write is left behind."""
        while queue:
            size = min(self.max_batch, len(queue))
            batch = [queue.popleft() for _ in range(size)]
            try:
                await self._apply(batch, wait=wait)
            except Exception as error:  # the database is unreachable: every waiter hears
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
            except BaseException:
                for _, future in batch:
                    future.cancel()
                raise

    async def _apply(self, batch: list[Pending], *, wait: bool) -> None:
        # one order for every batch, so two batches lock rows in the same order
        batch = sorted(batch, key=lambda item: _lock_order(item[0]))
        if len(batch) > 1:
            try:
                answers = await self._transaction([write for write, _ in batch], wait=wait)
            except JournalRefused:
                pass  # one write is refused, or a deadlock: apply them one by one
            else:
                for pending, answer in zip(batch, answers, strict=True):
                    self._answer(pending, answer)
                return
        for pending in batch:
            try:
                answer = await self._one(pending[0], wait=wait)
            except Exception as error:  # this write's own failure
                if not pending[1].done():
                    pending[1].set_exception(error)
            else:
                self._answer(pending, answer)

    def _answer(self, pending: Pending, answer: Answer | Erasing) -> None:
        write, future = pending
        if isinstance(answer, Erasing):
            self._set_aside(write["organization_id"], pending)
        elif not future.done():
            future.set_result(answer)

    # ------------------------------------------------------------------ erasure lanes

    def _set_aside(self, organization: str, pending: Pending) -> None:
        """Queue a write its organization's erasure holds, in that organization's lane."""
        lane = self._lanes.get(organization)
        if lane is None:
            lane = self._lanes[organization] = deque()
            task = asyncio.create_task(self._lane(organization, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        lane.append(pending)

    async def _lane(self, organization: str, lane: deque[Pending]) -> None:
        """Apply one organization's set-aside writes, waiting for its erasure."""
        try:
            async with self._lane_slots:
                await self._apply_queue(lane, wait=True)
        finally:
            del self._lanes[organization]  # no await since the queue was last seen empty

    async def _one(self, write: Write, *, wait: bool) -> Answer | Erasing:
        for attempt in (1, 2):
            try:
                (answer,) = await self._transaction([write], wait=wait)
            except ConstraintBroken as error:
                # Nothing was written or journaled; no retry will change it.
                log.warning("memory write refused by %s", error.constraint)
                return Refusal(reason="invalid_input", message=str(error), journaled=False)
            except WrittenConcurrently as error:
                if attempt == 1:
                    continue  # the other writer of this key committed: now it replays
                raise MemoryContention(str(error)) from error
            except LostTheRace as error:
                raise MemoryContention(str(error)) from error
            return answer
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _transaction(self, writes: list[Write], *, wait: bool) -> list[Answer | Erasing]:
        answers = await self.journal.apply(writes, wait=wait)
        if wait and any(isinstance(answer, Erasing) for answer in answers):
            raise LookupError("the journal set a write aside although asked to wait")
        return [
            answer if isinstance(answer, Erasing) else _journaled(write, answer)
            for write, answer in zip(writes, answers, strict=True)
        ]


def remember_write(invoker: Invoker, candidate: MemoryCandidate, idempotency_key: str) -> Write:
    """A ``memory.remember`` call as ``memory_apply`` takes it: refused by a rule that needs no
    row, or the chain it appends to and the text. Pure."""
    payload = candidate.model_dump(mode="json")
    write = _write(invoker, idempotency_key, "remember", payload)
    refusal = _remember_refusal(invoker, candidate)
    if refusal is not None:
        return _refused(write, refusal)
    candidate = canonical(invoker, candidate)
    user_id = invoker.user_id if candidate.scope == "user" else None
    owner = user_id if user_id is not None else invoker.organization_id
    refs = [ref.model_dump(exclude_none=True) for ref in candidate.subject_refs]
    write.update(
        scope=candidate.scope,
        user_id=None if user_id is None else str(user_id),
        scope_owner_id=str(owner),
        subject_key=subject_key(invoker, candidate),
        text=candidate.text,
        subject_refs=refs,
    )
    return write


def forget_write(invoker: Invoker, memory_id: UUID, idempotency_key: str) -> Write:
    """A ``memory.forget`` call as ``memory_apply`` takes it. Pure."""
    write = _write(invoker, idempotency_key, "forget", str(memory_id))
    if invoker.workflow_node:
        return _refused(write, _WORKFLOW_NODE)
    write.update(
        memory_id=str(memory_id),
        user_id=None if invoker.user_id is None else str(invoker.user_id),
    )
    return write


_WORKFLOW_NODE = Refusal(reason="workflow_node", message="a workflow tool node cannot write memory")


def _remember_refusal(invoker: Invoker, candidate: MemoryCandidate) -> Refusal | None:
    """The first rule that refuses the call without reading a row, in the spec's order."""
    if invoker.workflow_node:
        return _WORKFLOW_NODE
    if not candidate.attribute.startswith(NAMESPACES) or candidate.attribute in NAMESPACES:
        return Refusal(
            reason="namespace",
            message=f"attribute {candidate.attribute!r} is not observation.<name> "
            "or preference.<name>",
        )
    if candidate.scope == "user" and invoker.user_id is None:
        return Refusal(
            reason="trigger_user_scope", message="a trigger has no user: organization scope only"
        )
    for ref in candidate.subject_refs:
        if ref.kind in OWNER_KINDS and not names_the_scope_owner(
            ref, candidate.scope, invoker.organization_id, invoker.user_id
        ):
            return Refusal(
                reason="invalid_input",
                message=f"subject ref {ref.kind}:{ref.id} names no row a resolver owns: a memory "
                f"about its own {candidate.scope} takes no ref, and one about another "
                f"{ref.kind} would be dropped at every read",
            )
    return None


def _write(invoker: Invoker, key: str, operation: str, payload: object) -> Write:
    return {
        "organization_id": str(invoker.organization_id),
        "idempotency_key": key,
        "request_sha256": fingerprint(operation, invoker, payload),
        "operation": operation,
        "definition_id": str(invoker.definition_id),
        "run_id": None if invoker.run_id is None else str(invoker.run_id),
    }


def _refused(write: Write, refusal: Refusal) -> Write:
    return {**write, "refusal": {"reason": refusal.reason, "message": refusal.message}}


def _journaled(write: Write, answer: Answer) -> Answer:
    """``answer``, marked when the journal holds no row for it: memory_apply journals a
    refusal it was handed (``refusal``) and every answer of a new key, but not an
    ``invalid_input`` it gives a key reused for another call or a key whose write was erased,
    nor a ``quota`` refusal (00038)."""
    if isinstance(answer, Refusal) and answer.reason == "quota":
        return answer.model_copy(update={"journaled": False})
    if (
        isinstance(answer, Refusal)
        and answer.reason == "invalid_input"
        and not answer.replayed
        and "refusal" not in write
    ):
        return answer.model_copy(update={"journaled": False})
    return answer


def _lock_order(write: Write) -> tuple[str, ...]:
    """Batches lock chains in one order, so two of them do not deadlock on two chains. A
    forget's chain is unknown until the database reads it: it sorts by its revision id, and a
    deadlock that this leaves possible rolls its batch back to one write at a time."""
    return tuple(
        write.get(part) or ""
        for part in (
            "organization_id",
            "definition_id",
            "scope",
            "scope_owner_id",
            "subject_key",
            "memory_id",
        )
    )
