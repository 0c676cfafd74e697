"""Retries and dead letters (consumers/runtime/retries.py): a retry copy with its headers, a
bounded letter, the minimal one, a farewell to the caller of a record given up on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from consumers.runtime.inmemory import MemoryBroker, MemoryPublisher
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_FIRST_POSITION,
    HEADER_LAST_ERROR,
    HEADER_NOT_BEFORE,
    DeadLetter,
    Inbound,
    Outcome,
    Retry,
)
from consumers.runtime.retries import Retries
from consumers.runtime.transport import PublishError
from schemas.envelope import DeadLetterV1
from tests.unit.runtime_fakes import (
    Rig,
    Scripted,
    letter_of,
    record,
    replies_on,
    reply,
    settings,
)


async def test_a_handler_that_raises_is_retried_through_the_topic_then_dead_lettered() -> None:
    def explode(record: Inbound) -> Outcome:
        raise RuntimeError("the database went away")

    rig = Rig(Scripted(explode))
    await rig.delivery.submit(record(7, b"payload"))
    await rig.settle()
    [retry] = rig.publisher.to("t")
    assert (retry.value, retry.key) == (b"payload", b"k")
    assert retry.headers[HEADER_ATTEMPT] == b"2"
    assert retry.headers[HEADER_FIRST_POSITION] == b"t/0/7"
    assert int(retry.headers[HEADER_NOT_BEFORE]) > 0
    assert rig.committer.last() == 8  # the original is done: its retry is a new record

    headers = {**retry.headers, HEADER_ATTEMPT: b"3"}  # as the third delivery carries them
    last = Inbound("t", 0, 8, b"k", b"payload", tuple(headers.items()))
    await rig.delivery.submit(last)
    await rig.settle()
    [letter] = rig.publisher.to("t.dlt")
    parsed = DeadLetterV1.model_validate_json(letter.value)
    assert (parsed.cause, parsed.attempts, parsed.offset) == ("gave_up", 3, 7)
    assert "RuntimeError: the database went away" in parsed.reason
    assert rig.committer.last() == 9
    await rig.close()


async def test_a_dead_letter_the_broker_refuses_is_tried_again_until_it_is_taken() -> None:
    rig = Rig(Scripted(lambda r: DeadLetter("not_json", "garbage")))
    rig.publisher.failures["t.dlt"] = [PublishError("broker down", retriable=True)] * 3
    await rig.delivery.submit(record(0, b"garbage"))
    await asyncio.sleep(0.01)
    assert rig.committer.last() is None  # not committed while the letter is not out
    await asyncio.wait_for(rig.settle(), 5)
    assert len(rig.publisher.to("t.dlt")) == 1
    assert rig.committer.last() == 1
    await rig.close()


async def test_a_copy_or_a_letter_the_broker_will_never_take_does_not_stall_the_partition() -> None:
    def explode(record: Inbound) -> Outcome:
        raise RuntimeError("flaky")

    rig = Rig(Scripted(explode))
    rig.publisher.failures["t"] = [PublishError("too large", retriable=False)]
    rig.publisher.failures["t.dlt"] = [PublishError("too large", retriable=False)]
    await rig.delivery.submit(record(0, b"x" * 1000))
    await rig.settle()
    [letter] = rig.publisher.to("t.dlt")  # the full letter refused: the minimal one went
    parsed = DeadLetterV1.model_validate_json(letter.value)
    assert (parsed.cause, parsed.payload, parsed.payload_bytes) == ("retry_refused", "", 1000)
    assert "its retry copy: too large" in parsed.reason
    assert rig.committer.last() == 1
    await rig.close()


async def test_a_forged_first_position_is_not_believed() -> None:
    rig = Rig(Scripted(lambda r: DeadLetter("invalid", "bad")))
    forged = {HEADER_FIRST_POSITION: b"payments/0/7", HEADER_ATTEMPT: b"2"}
    await rig.delivery.submit(record(3, headers=forged))
    await rig.settle()
    [letter] = rig.publisher.to("t.dlt")
    parsed = DeadLetterV1.model_validate_json(letter.value)
    assert (parsed.topic, parsed.partition, parsed.offset) == ("t", 0, 3)
    assert letter.headers["x-original-topic"] == b"t"
    await rig.close()


async def test_a_record_given_up_on_is_answered_besides_its_deadletter_of() -> None:
    def explode(record: Inbound) -> Outcome:
        raise RuntimeError("a bug")

    handler = Scripted(explode)
    rig = Rig(handler, max_attempts=1)
    await rig.delivery.submit(record(3))
    await rig.settle()
    assert [m.cause for m in map(letter_of, rig.publisher.to("t.dlt"))] == ["gave_up"]
    assert [offset for offset, _ in handler.farewells] == [3]
    assert handler.farewells[0][1] == "gave_up: an internal error (after 1 attempts)"
    assert "a bug" in letter_of(rig.publisher.to("t.dlt")[0]).reason  # the operator's, only
    await rig.close()


# ------------------------------------------------- Retries alone, on the in-memory broker


def retries_on(broker: MemoryBroker, handler: Scripted, **changes: Any) -> Retries:
    return Retries(
        consumer="test",
        publisher=MemoryPublisher(broker),
        handler=handler,
        replies=replies_on(broker),
        settings=settings(**changes),
        metrics=RuntimeMetrics.create(),
        max_record_bytes=4_096,
        wall_ms=lambda: 1_000,
        sleep=asyncio.sleep,
    )


async def test_a_retry_copy_carries_its_attempt_first_position_and_not_before() -> None:
    broker = MemoryBroker()
    retries = retries_on(broker, Scripted(reply), retry_backoff_s=0.5, retry_backoff_max_s=5)
    kept = await retries.retry(record(4, b"payload"), Retry("timeout", "too slow"))
    assert kept == Retry("timeout", "too slow")
    [copy] = broker.records("t")
    headers = dict(copy.headers)
    assert (copy.value, copy.key) == (b"payload", b"k")
    assert headers[HEADER_ATTEMPT] == b"2"
    assert headers[HEADER_FIRST_POSITION] == b"t/0/4"
    assert headers[HEADER_NOT_BEFORE] == b"1500"  # the wall clock and the first back-off
    assert headers[HEADER_LAST_ERROR] == b"too slow"


async def test_a_record_out_of_attempts_becomes_a_dead_letter_and_no_copy() -> None:
    broker = MemoryBroker()
    retries = retries_on(broker, Scripted(reply), max_attempts=2)
    spent = record(9, headers={HEADER_ATTEMPT: b"2"})
    letter = await retries.retry(spent, Retry("handler_error", "KeyError: 'x'"))
    assert letter == DeadLetter(
        "gave_up",
        "handler_error: KeyError: 'x' (after 2 attempts)",
        told="an internal error (after 2 attempts)",
    )
    assert broker.records("t") == []


async def test_a_letter_refused_for_good_goes_minimal_and_the_caller_is_told() -> None:
    broker = MemoryBroker()
    handler = Scripted(reply)
    retries = retries_on(broker, handler)
    broker.refuse("t.dlt", retriable=False, times=1)
    await retries.give_up(record(3, b"x" * 600), DeadLetter("gave_up", "boom", told="told"))
    [letter] = map(letter_of, broker.records("t.dlt"))
    assert (letter.cause, letter.payload, letter.payload_bytes) == ("gave_up", "", 600)
    assert handler.farewells == [(3, "gave_up: told")]
    [farewell] = broker.records("replies")
    assert json.loads(farewell.value or b"") == {"text": "gave_up: told"}
