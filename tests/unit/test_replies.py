"""Replies (consumers/runtime/replies.py): published, replaced by their fallback, retried or
dead-lettered as the broker answers."""

from __future__ import annotations

import json

from consumers.runtime.inmemory import MemoryBroker
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    DeadLetter,
    Inbound,
    Outcome,
    Reply,
    Retry,
    Stopwatch,
)
from consumers.runtime.transport import PublishError
from schemas.envelope import DeadLetterV1
from tests.unit.runtime_fakes import (
    Message,
    Rig,
    Scripted,
    record,
    replies_on,
    reply,
)


async def test_a_reply_that_cannot_be_serialised_or_is_too_large_becomes_its_fallback() -> None:
    def broken(record: Inbound) -> Outcome:
        text = "\ud800" if record.offset == 0 else "x" * 10_000
        return Reply(
            "replies",
            f"c-{record.offset}",
            Message(text=text),
            fallback=lambda reason: Message(text=f"error: {reason}"),
        )

    rig = Rig(Scripted(broken))
    await rig.delivery.submit(record(0))
    await rig.delivery.submit(record(1))
    await rig.settle()
    texts = sorted(json.loads(s.value)["text"] for s in rig.publisher.to("replies"))
    assert texts[0].startswith("error: the reply to 'replies' cannot be sent: it could not be")
    assert texts[1].startswith("error: the reply to 'replies' cannot be sent: it is 10011 bytes")
    assert rig.committer.last() == 2
    await rig.close()


async def test_publish_failures_retry_fall_back_or_dead_letter_as_they_must() -> None:
    rig = Rig(Scripted(reply))
    rig.publisher.failures["replies"] = [PublishError("leader moved", retriable=True)]
    await rig.delivery.submit(record(0))
    await rig.settle()
    assert rig.publisher.to("t")[0].headers[HEADER_ATTEMPT] == b"2"  # retried later

    def with_fallback(record: Inbound) -> Outcome:
        return Reply("replies", "c", Message(text="big"), fallback=lambda r: Message(text=r))

    rig = Rig(Scripted(with_fallback))
    rig.publisher.failures["replies"] = [PublishError("too large", retriable=False)]
    await rig.delivery.submit(record(0))
    await rig.settle()
    [sent] = rig.publisher.to("replies")
    assert "the broker refused it: too large" in json.loads(sent.value)["text"]

    rig = Rig(Scripted(with_fallback))
    rig.publisher.failures["replies"] = [
        PublishError("too large", retriable=False),
        PublishError("topic gone", retriable=False),
    ]
    await rig.delivery.submit(record(0))
    await rig.settle()
    [letter] = rig.publisher.to("t.dlt")
    assert DeadLetterV1.model_validate_json(letter.value).cause == "reply_refused"
    await rig.close()


# ------------------------------------------------- Replies alone, on the in-memory broker


async def test_a_reply_lands_on_its_topic_with_its_correlation_id() -> None:
    broker = MemoryBroker()
    sent = await replies_on(broker).publish(
        Reply("replies", "c-1", Message(text="hi")), Stopwatch()
    )
    assert sent == Reply("replies", "c-1", Message(text="hi"))
    [landed] = broker.records("replies")
    assert landed.value == b'{"text":"hi"}'
    assert dict(landed.headers)["correlation_id"] == b"c-1"


async def test_a_reply_to_a_topic_the_rule_refuses_is_never_published() -> None:
    broker = MemoryBroker()
    outcome = await replies_on(broker).publish(Reply("t.dlt", "c", Message(text="x")), Stopwatch())
    assert isinstance(outcome, DeadLetter)
    assert outcome.cause == "reply_to_refused"
    assert broker.records("t.dlt") == []
    assert not await replies_on(broker).farewell(Reply("t.dlt", "c", Message(text="bye")))
    assert broker.records("t.dlt") == []


async def test_a_broker_that_refuses_for_now_is_a_retry_and_for_good_the_fallback() -> None:
    broker = MemoryBroker()
    replies = replies_on(broker)
    answer = Reply("replies", "c", Message(text="big"), fallback=lambda r: Message(text=r))
    broker.refuse("replies", retriable=True, times=1)
    retry = await replies.publish(answer, Stopwatch())
    assert isinstance(retry, Retry)
    assert retry.cause == "reply_publish"
    broker.refuse("replies", retriable=False, times=1)
    fallback = await replies.publish(answer, Stopwatch())
    assert isinstance(fallback, Reply)
    [landed] = broker.records("replies")
    assert json.loads(landed.value or b"")["text"].startswith("the reply to 'replies' cannot be")
    assert fallback.message == Message.model_validate_json(landed.value or b"")
