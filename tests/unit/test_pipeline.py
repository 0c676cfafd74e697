"""One record's path (consumers/runtime/pipeline.py): the back-off of a retried copy, the
intake bound, a database that does not answer, a timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from consumers.runtime.commits import Commits
from consumers.runtime.inmemory import MemoryBroker, MemoryPublisher, MemoryStartJournal
from consumers.runtime.journal import Start
from consumers.runtime.metrics import RuntimeMetrics, Stages
from consumers.runtime.pipeline import Pipeline
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_NOT_BEFORE,
    Done,
    Inbound,
    Outcome,
    Stopwatch,
)
from consumers.runtime.tracker import InFlight
from schemas.errors import InfrastructureUnavailable
from tests.unit.runtime_fakes import (
    REPLY_TOPICS,
    Rig,
    Scripted,
    letter_of,
    member,
    record,
    reply,
    settings,
)


async def test_a_retried_copy_waits_out_its_back_off_and_no_more() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    rig = Rig(
        Scripted(lambda r: Done()),
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
        sleep=sleep,
        wall_ms=lambda: 1_000_000,
    )

    def copy(offset: int, attempt: bytes, not_before: bytes) -> Inbound:
        return Inbound(
            "t",
            0,
            offset,
            None,
            b"{}",
            ((HEADER_ATTEMPT, attempt), (HEADER_NOT_BEFORE, not_before)),
        )

    await rig.delivery.submit(copy(0, b"2", b"1000005"))  # 5 ms to go: waits 5 ms
    await rig.delivery.submit(copy(1, b"3", str(10**15).encode()))  # forged: its back-off, 20 ms
    await rig.delivery.submit(copy(2, b"1", str(10**15).encode()))  # a first delivery never waits
    await rig.delivery.submit(copy(3, b"2", b"5"))  # due in the past: no wait
    await rig.settle()
    assert sorted(waits) == pytest.approx([0.005, 0.02])
    assert rig.committer.last() == 4
    await rig.close()


async def test_a_record_larger_than_a_producer_of_ours_sends_is_never_read() -> None:
    """Whatever the broker took: what a handler makes of a value grows with it."""
    handler = Scripted(reply)
    rig = Rig(handler)
    await rig.delivery.submit(record(0, value=b"x" * 1_048_577))
    await rig.delivery.submit(record(1))
    await rig.settle()
    [letter] = map(letter_of, rig.publisher.to("t.dlt"))
    assert (letter.cause, letter.offset, letter.payload_bytes) == ("too_large", 0, 1_048_577)
    assert handler.seen == [1]
    await rig.close()


async def test_a_database_that_does_not_answer_is_waited_for_in_place() -> None:
    calls = 0

    def flaky(record: Inbound) -> Outcome:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise InfrastructureUnavailable("the database did not answer: ConnectionRefusedError")
        return reply(record)

    rig = Rig(Scripted(flaky), max_attempts=2, unavailable_wait_max_s=0.02)
    await rig.delivery.submit(record(0))
    await rig.settle()
    assert calls == 4
    assert [s.value for s in rig.publisher.to("replies")] == [b'{"text":"answer 0"}']
    assert not rig.publisher.to("t")  # no retry copy: no attempt was spent
    assert not rig.publisher.to("t.dlt")
    assert rig.delivery.metrics.waits.labels("test", "database")._value.get() == 3
    await rig.close()


# ------------------------------------------ the Pipeline alone, on the in-memory broker


def pipeline_on(
    broker: MemoryBroker, handler: Scripted, journal: MemoryStartJournal, **changes: Any
) -> Pipeline:
    metrics = RuntimeMetrics.create()
    in_flight = InFlight()
    in_flight.assign([("t", 0)])
    commits = Commits(
        consumer="test",
        in_flight=in_flight,
        journal=journal,
        metrics=metrics,
        stages=Stages(metrics, "test"),
        interval_s=0.0,
        clock=lambda: 0.0,
    )
    return Pipeline(
        consumer="test",
        handler=handler,
        publisher=MemoryPublisher(broker),
        reply_topics=REPLY_TOPICS,
        commits=commits,
        journal=journal,
        settings=settings(**changes),
        metrics=metrics,
        stages=Stages(metrics, "test"),
        max_record_bytes=4_096,
        wall_ms=lambda: 0,
        sleep=asyncio.sleep,
    )


async def test_a_suspect_runs_alone_and_is_committed_before_the_pipeline_returns() -> None:
    broker, journal = MemoryBroker(), MemoryStartJournal()
    pipeline = pipeline_on(broker, Scripted(reply), journal)
    pipeline.commits.committer = (await member(broker)).committer
    await journal.started(Start.of(record(0)))  # a start without an outcome: its process died
    tracker = pipeline.commits.in_flight.tracker(("t", 0))
    assert tracker is not None
    assert tracker.start(0, now=0.0)
    await pipeline.deliver(record(0), tracker)
    assert [r.value for r in broker.records("replies")] == [b'{"text":"answer 0"}']
    assert broker.committed("g") == {("t", 0): 1}  # at once, not by the background task
    assert journal.starts == {}  # committed: forgotten


async def test_a_handler_past_its_timeout_is_retried_through_its_topic() -> None:
    async def slow(record: Inbound, watch: Stopwatch) -> Outcome:
        await asyncio.sleep(1)
        return reply(record)

    handler = Scripted(reply)
    handler.handle = slow  # type: ignore[method-assign]
    broker = MemoryBroker()
    pipeline = pipeline_on(broker, handler, MemoryStartJournal(), handle_timeout_s=0.01)
    await pipeline.settle(record(0))
    [copy] = broker.records("t")
    assert dict(copy.headers)[HEADER_ATTEMPT] == b"2"
    assert b"not handled within 0.01 s" in dict(copy.headers)["contextcore-last-error"]
    assert broker.records("replies") == []
