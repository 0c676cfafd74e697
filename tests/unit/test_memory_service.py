"""MemoryService's own logic on an in-memory journal (the port of contextcore/memory/service.py):
group commit, a refused batch applied one write at a time, the refusals no retry changes, the
races it retries, and what every waiter hears when the journal is away. The rules inside the
database (``memory_apply``) are tested against PostgreSQL (tests/integration/test_memory_*.py);
the rules that need no row in tests/unit/test_memory_models.py."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from uuid import UUID

import pytest

from contextcore.memory.service import (
    ConstraintBroken,
    Erasing,
    JournalRefused,
    LostTheRace,
    MemoryContention,
    MemoryService,
    Write,
    WrittenConcurrently,
)
from schemas.memory import AgentMemory, Answer, Invoker, MemoryCandidate, Refusal, Written

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000a1")
AGENT = uuid.UUID("7b000000-0000-4000-8000-0000000000d1")
USER = uuid.UUID("7b000000-0000-4000-8000-0000000000b1")
ME = Invoker(organization_id=ORG, definition_id=AGENT, user_id=USER)


def candidate(attribute: str, text: str = "Tuesdays") -> MemoryCandidate:
    return MemoryCandidate(scope="user", attribute=attribute, text=text)


class Journal:
    """Answers each write ``created``, or the refusal the service handed it; raises what a test
    plans for a transaction that holds a given idempotency key."""

    def __init__(self) -> None:
        self.transactions: list[list[str]] = []
        self.planned: dict[str, list[BaseException]] = {}
        self.counted: list[tuple[UUID, str]] = []

    def plan(self, key: str, *errors: BaseException) -> None:
        """The next transactions holding ``key`` raise these, one each, in order."""
        self.planned[key] = list(errors)

    async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
        keys = [write["idempotency_key"] for write in writes]
        self.transactions.append(keys)
        await asyncio.sleep(0)  # a round trip: other calls queue meanwhile
        for key in keys:
            if self.planned.get(key):
                raise self.planned[key].pop(0)
        return [self.answer(write) for write in writes]

    @staticmethod
    def answer(write: Write) -> Answer:
        if "refusal" in write:
            return Refusal(**write["refusal"])
        memory = AgentMemory(
            id=uuid.uuid4(),
            organization_id=write["organization_id"],
            definition_id=write["definition_id"],
            scope=write["scope"],
            user_id=write["user_id"],
            subject_key=write["subject_key"],
            text=write["text"],
            subject_refs=[],
            proposed_by_run_id=None,
            supersedes_id=None,
            forgotten_at=None,
            created_at=datetime.now(UTC),
        )
        return Written(change="created", memory=memory, chain_length=1)

    async def count_refusal(self, organization_id: UUID, operation: str) -> None:
        self.counted.append((organization_id, operation))


async def remember_all(service: MemoryService, keys: list[str]) -> list[Answer]:
    calls = [service.remember(ME, candidate(f"preference.{key}"), key) for key in keys]
    return await asyncio.gather(*calls)


async def test_calls_that_gather_while_a_batch_runs_go_together_up_to_max_batch() -> None:
    journal = Journal()
    service = MemoryService(journal, max_batch=4, concurrency=1)
    keys = [f"k{i}" for i in range(10)]
    answers = await remember_all(service, keys)
    assert [len(t) for t in journal.transactions] == [4, 4, 2]
    assert sorted(k for t in journal.transactions for k in t) == sorted(keys)
    for key, answer in zip(keys, answers, strict=True):
        assert isinstance(answer, Written)
        assert answer.memory.subject_key == f"user:{USER}:preference.{key}"  # its own answer


async def test_a_lone_call_is_a_batch_of_one_and_waits_for_nothing() -> None:
    journal = Journal()
    service = MemoryService(journal, max_batch=64, concurrency=2)
    answer = await service.remember(ME, candidate("preference.language"), "only")
    assert isinstance(answer, Written)
    assert journal.transactions == [["only"]]


async def test_a_batch_locks_its_chains_in_one_order_whatever_the_arrival() -> None:
    journal = Journal()
    service = MemoryService(journal, max_batch=8, concurrency=1)
    await remember_all(service, ["c", "a", "b"])
    await remember_all(service, ["b", "c", "a"])
    assert journal.transactions[0] == journal.transactions[1] == ["a", "b", "c"]


async def test_a_refused_batch_is_applied_one_write_at_a_time() -> None:
    journal = Journal()
    journal.plan("b", JournalRefused("deadlock detected"), ConstraintBroken("memories_text_len"))
    service = MemoryService(journal, max_batch=8, concurrency=1)
    a, b, c = await remember_all(service, ["a", "b", "c"])
    assert journal.transactions == [["a", "b", "c"], ["a"], ["b"], ["c"]]
    assert isinstance(a, Written)
    assert isinstance(c, Written)
    assert b == Refusal(  # a rule no retry changes: answered, and counted apart
        reason="invalid_input",
        message="the memory store refuses this write",  # the constraint's name is logged only
        journaled=False,
    )


async def test_a_writer_of_the_same_key_that_committed_is_replayed_once_then_contention() -> None:
    journal = Journal()
    journal.plan("k", WrittenConcurrently("CC002"))
    service = MemoryService(journal)
    assert isinstance(await service.remember(ME, candidate("preference.x"), "k"), Written)
    assert journal.transactions == [["k"], ["k"]]

    journal.plan("k", WrittenConcurrently("CC002"), WrittenConcurrently("CC002"))
    with pytest.raises(MemoryContention):
        await service.remember(ME, candidate("preference.x"), "k")


async def test_a_lost_race_for_a_head_is_contention_at_once() -> None:
    journal = Journal()
    journal.plan("k", LostTheRace("CC001"))
    service = MemoryService(journal)
    with pytest.raises(MemoryContention):
        await service.remember(ME, candidate("preference.x"), "k")
    assert journal.transactions == [["k"]]


async def test_another_refusal_of_a_lone_write_reaches_its_caller_only() -> None:
    journal = Journal()
    journal.plan("b", JournalRefused("x"), JournalRefused("serialization failure"))
    service = MemoryService(journal, max_batch=8, concurrency=1)
    results = await asyncio.gather(
        *[service.remember(ME, candidate(f"preference.{k}"), k) for k in "abc"],
        return_exceptions=True,
    )
    assert isinstance(results[0], Written)
    assert isinstance(results[1], JournalRefused)
    assert isinstance(results[2], Written)


async def test_when_the_journal_is_away_every_waiter_of_the_batch_hears_it() -> None:
    journal = Journal()
    away = ConnectionRefusedError("the database is away")
    journal.plan("a", away)
    service = MemoryService(journal, max_batch=8, concurrency=1)
    results = await asyncio.gather(
        *[service.remember(ME, candidate(f"preference.{k}"), k) for k in "abc"],
        return_exceptions=True,
    )
    assert results == [away, away, away]
    assert journal.transactions == [["a", "b", "c"]]  # not retried one by one: nothing to split
    assert isinstance(await service.remember(ME, candidate("preference.a"), "a"), Written)


async def test_a_rule_refusal_is_handed_to_the_journal_and_answered_from_it() -> None:
    journal = Journal()
    service = MemoryService(journal)
    answer = await service.remember(ME, candidate("language"), "k")
    assert isinstance(answer, Refusal)
    assert answer.reason == "namespace"
    assert answer.journaled  # memory_apply journals the refusal it is handed
    assert journal.transactions == [["k"]]


async def test_an_invalid_input_the_journal_gives_a_reused_key_is_marked_unjournaled() -> None:
    class Reused(Journal):
        @staticmethod
        def answer(write: Write) -> Answer:
            return Refusal(reason="invalid_input", message="key reused for another call")

    service = MemoryService(Reused())
    answer = await service.remember(ME, candidate("preference.x"), "k")
    assert isinstance(answer, Refusal)
    assert not answer.journaled


async def test_an_unjournaled_refusal_is_counted_through_the_journal() -> None:
    journal = Journal()
    await MemoryService(journal).count_unjournaled_refusal(ORG, "forget")
    assert journal.counted == [(ORG, "forget")]


def test_a_refusal_keeps_the_databases_code_for_the_exit_status() -> None:
    from schemas.errors import EXIT_UNAVAILABLE, exit_code

    assert exit_code(JournalRefused("too many connections", "53300")) == EXIT_UNAVAILABLE
    assert exit_code(JournalRefused("deadlock detected", "40P01")) != EXIT_UNAVAILABLE


def test_a_service_needs_a_batch_and_a_runner() -> None:
    with pytest.raises(ValueError, match="at least"):
        MemoryService(Journal(), max_batch=0)
    with pytest.raises(ValueError, match="at least"):
        MemoryService(Journal(), concurrency=0)


class ErasingJournal(Journal):
    """``erased`` is being erased until ``done`` is set: a write of it that may not wait is
    :class:`Erasing`; one that may waits for ``done``."""

    def __init__(self, erased: UUID) -> None:
        super().__init__()
        self.erased = str(erased)
        self.done = asyncio.Event()
        self.waited: list[list[str]] = []

    async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
        ours = any(write["organization_id"] == self.erased for write in writes)
        if ours and wait:
            self.waited.append([write["idempotency_key"] for write in writes])
            await self.done.wait()
        answers = await super().apply(writes)
        if ours and not self.done.is_set():
            return [
                Erasing() if write["organization_id"] == self.erased else answer
                for write, answer in zip(writes, answers, strict=True)
            ]
        return answers


async def test_a_batch_answers_another_organizations_writes_while_one_is_erased() -> None:
    """Migration 00037: a batch that holds a write of an organization being erased applies the
    others at once; that write waits in its organization's lane and is applied after."""
    erased = uuid.UUID("7b000000-0000-4000-8000-0000000000e1")
    journal = ErasingJournal(erased)
    service = MemoryService(journal, max_batch=8, concurrency=1)
    theirs = Invoker(organization_id=erased, definition_id=AGENT, user_id=USER)
    held = [
        asyncio.create_task(service.remember(theirs, candidate(f"preference.e{i}"), f"e{i}"))
        for i in range(3)
    ]
    ours = await remember_all(service, [f"k{i}" for i in range(5)])
    assert all(isinstance(answer, Written) for answer in ours)
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in held)  # they wait for the erasure, in their lane
    assert journal.waited == [["e0", "e1", "e2"]]  # in one batch, asked to wait
    journal.done.set()
    for task in held:
        answer = await task
        assert isinstance(answer, Written)
        assert answer.memory.organization_id == erased
    assert not service._lanes  # the lane ends with its queue


async def test_a_journal_that_sets_a_write_aside_when_asked_to_wait_is_a_bug() -> None:
    class Wrong(Journal):
        async def apply(self, writes: list[Write], *, wait: bool = True) -> list[Answer | Erasing]:
            return [Erasing() for _ in writes]

    service = MemoryService(Wrong(), max_batch=8, concurrency=1)
    with pytest.raises(LookupError, match="asked to wait"):
        await service.remember(ME, candidate("preference.x"), "x")
