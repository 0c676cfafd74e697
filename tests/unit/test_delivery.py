"""The delivery pipeline against tiny fakes of its ports (publisher, committer, handler).

What these prove is the runtime's own logic: one outcome per record, commits that never pass an
unfinished record, retries counted in headers, bounded dead letters, drains. The same paths run
through the real broker in ``tests/integration/test_delivery_runtime.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from broker.lanes import HEADER_ORGANIZATION
from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from consumers.runtime.delivery import Delivery, PublishError
from consumers.runtime.journal import Prior
from consumers.runtime.lanes import Lanes
from consumers.runtime.letters import dead_letter
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_FIRST_POSITION,
    HEADER_NOT_BEFORE,
    DeadLetter,
    Done,
    Inbound,
    Outcome,
    Position,
    Reply,
    Stopwatch,
    backoff_s,
)
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import PartitionTracker
from schemas.envelope import DeadLetterV1
from schemas.errors import InfrastructureUnavailable


class Message(BaseModel):
    text: str


@dataclass
class Sent:
    topic: str
    value: bytes
    key: bytes | None
    headers: dict[str, bytes]


@dataclass
class FakePublisher:
    failures: dict[str, list[PublishError]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    async def publish(
        self, topic: str, value: bytes, *, key: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        await asyncio.sleep(0)
        queued = self.failures.get(topic)
        if queued:
            raise queued.pop(0)
        self.sent.append(Sent(topic, value, key, dict(headers)))

    def to(self, topic: str) -> list[Sent]:
        return [s for s in self.sent if s.topic == topic]


@dataclass
class FakeCommitter:
    commits: list[dict[tuple[str, int], int]] = field(default_factory=list)

    async def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.commits.append(dict(positions))

    owned: set[tuple[str, int]] = field(default_factory=set)

    def owns(self, partition: tuple[str, int]) -> bool:
        return partition in self.owned

    watermarks: dict[tuple[str, int], int] = field(default_factory=dict)

    def high_watermark(self, partition: tuple[str, int]) -> int | None:
        return self.watermarks.get(partition)

    def last(self, partition: tuple[str, int] = ("t", 0)) -> int | None:
        found = [c[partition] for c in self.commits if partition in c]
        return found[-1] if found else None


class Scripted:
    """A handler whose outcome per offset is scripted; it can wait on a gate per offset."""

    def __init__(self, outcome: Callable[[Inbound], Outcome]) -> None:
        self.outcome = outcome
        self.gates: dict[int, asyncio.Event] = {}
        self.seen: list[int] = []
        self.farewells: list[tuple[int, str]] = []

    def hold(self, *offsets: int) -> None:
        for offset in offsets:
            self.gates[offset] = asyncio.Event()

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        self.seen.append(record.offset)
        if record.offset in self.gates:
            await self.gates[record.offset].wait()
        return self.outcome(record)

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        self.farewells.append((record.offset, reason))
        return Reply("replies", f"farewell-{record.offset}", Message(text=reason))


def reply(record: Inbound) -> Outcome:
    return Reply("replies", f"c-{record.offset}", Message(text=f"answer {record.offset}"))


def settings(**changes: Any) -> ConsumerSettings:
    values: dict[str, Any] = {
        "group_id": "g",
        "metrics_port": 0,
        "max_in_flight": 8,
        "handle_timeout_s": 5.0,
        "stuck_after_s": 10.0,
        "drain_timeout_s": 2.0,
        "max_attempts": 3,
        "retry_backoff_s": 0.01,
        "retry_backoff_max_s": 0.05,
        "dead_letter_payload_bytes": 256,
        "commit_interval_s": 0.0,
    }
    return ConsumerSettings.model_construct(**{**values, **changes})


def record(
    offset: int, value: bytes = b"{}", partition: int = 0, headers: dict[str, bytes] | None = None
) -> Inbound:
    return Inbound("t", partition, offset, b"k", value, tuple((headers or {}).items()))


@dataclass
class FakeJournal:
    """The start journal's port: what each position's earlier starts left, and every call."""

    prior: dict[int, Prior] = field(default_factory=dict)
    calls: list[tuple[str, object]] = field(default_factory=list)

    async def started(self, position: Position) -> Prior:
        self.calls.append(("started", position.offset))
        return self.prior.get(position.offset, Prior())

    async def solo_started(self, position: Position) -> None:
        self.calls.append(("solo_started", position.offset))

    async def solo_finished(self, position: Position) -> None:
        self.calls.append(("solo_finished", position.offset))

    async def forget(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.calls.append(("forget", dict(positions)))


REPLY_TOPICS = ReplyTopics.of(
    TopicSettings.model_construct(reply_prefix="replies", reply_pattern=r"replies(\..+)?")
)
"""The rule of these tests: ``replies`` and the names under it."""


class Rig:
    def __init__(
        self, handler: Scripted, journal: FakeJournal | None = None, **changes: Any
    ) -> None:
        self.publisher = FakePublisher()
        self.committer = FakeCommitter()
        self.handler = handler
        self.journal = journal or FakeJournal()
        self.delivery = Delivery(
            consumer="test",
            handler=handler,
            publisher=self.publisher,
            settings=settings(**changes),
            max_record_bytes=4_096,
            metrics=RuntimeMetrics.create(),
            reply_topics=REPLY_TOPICS,
            journal=self.journal,
        )
        self.delivery.assign([("t", 0), ("t", 1)])
        self.delivery.start(self.committer)

    async def settle(self) -> None:
        """Let every started record finish and the committer run."""
        for _ in range(50):
            await asyncio.sleep(0)
        while tasks := [t for ts in self.delivery._tasks.values() for t in ts]:
            await asyncio.gather(*tasks)
        for _ in range(20):
            await asyncio.sleep(0)

    async def close(self) -> None:
        await self.delivery.close()


# ---------------------------------------------------------------------------- pure pieces


def test_a_commit_position_never_passes_an_unfinished_record() -> None:
    tracker = PartitionTracker()
    for offset in (5, 6, 7, 9):
        assert tracker.start(offset, now=0.0)
    assert not tracker.start(6, now=0.0)  # a duplicate delivery is not tracked twice
    assert tracker.finish(7) is None  # 5 and 6 are still running
    assert tracker.finish(6) is None
    assert tracker.oldest_start() == 0.0
    assert tracker.finish(5) == 8  # 5, 6, 7 are done; 9 is not
    assert tracker.in_flight == 1
    assert tracker.finish(9) == 10  # offsets may have gaps (compaction, retried records)
    assert tracker.oldest_start() is None
    assert not tracker.start(3, now=1.0)  # below the position: already handled


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(n, base_s=0.2, max_s=1.0) for n in (1, 2, 3, 4, 99)] == [
        0.2,
        0.4,
        0.8,
        1.0,
        1.0,
    ]


def test_a_dead_letter_always_fits_and_keeps_size_and_digest() -> None:
    payload = b"\x01" * 100_000  # each byte escapes to six in JSON
    body, headers = dead_letter(
        record(41, payload),
        cause="not_json",
        reason="bad \ud800 input " * 500,
        consumer_group="g",
        payload_limit=64 * 1024,
        max_bytes=50_000,
    )
    letter = DeadLetterV1.model_validate_json(body)
    assert len(body) <= 50_000
    assert (letter.topic, letter.partition, letter.offset) == ("t", 0, 41)
    assert letter.payload_bytes == 100_000
    assert letter.payload_sha256 == hashlib.sha256(payload).hexdigest()
    assert letter.payload_truncated
    assert 0 < len(letter.payload) < 100_000
    assert len(letter.reason) <= 2_000
    assert "\ud800" not in letter.reason  # printable: it could be published
    assert dict(headers)["x-original-offset"] == b"41"


def test_a_retried_record_keeps_its_first_position_and_attempt() -> None:
    retried = record(
        90,
        headers={
            HEADER_ATTEMPT: b"3",
            HEADER_FIRST_POSITION: b"t/1/12",
            HEADER_NOT_BEFORE: b"1000",
        },
    )
    assert retried.attempt == 3
    assert str(retried.first_position) == "t/1/12"
    assert retried.not_before_ms == 1000
    assert retried.own_headers() == []
    forged = record(1, headers={HEADER_ATTEMPT: b"-5", HEADER_FIRST_POSITION: b"nonsense"})
    assert forged.attempt == 1
    assert str(forged.first_position) == "t/0/1"


# ---------------------------------------------------------------------------- the pipeline


async def test_records_finish_out_of_order_and_commits_wait_for_the_lowest() -> None:
    handler = Scripted(reply)
    handler.hold(0, 1)
    rig = Rig(handler)
    for offset in range(4):
        await rig.delivery.submit(record(offset))
    await asyncio.sleep(0.01)
    assert sorted(s.value for s in rig.publisher.to("replies")) == [
        b'{"text":"answer 2"}',
        b'{"text":"answer 3"}',
    ]
    assert rig.committer.last() is None  # 0 and 1 are still in flight
    handler.gates[1].set()
    await asyncio.sleep(0.01)
    assert rig.committer.last() is None
    handler.gates[0].set()
    await rig.settle()
    assert rig.committer.last() == 4
    await rig.close()


async def test_a_record_of_an_owned_partition_the_listener_did_not_announce_is_tracked() -> None:
    rig = Rig(Scripted(reply))
    rig.committer.owned = {("t", 5)}
    await rig.delivery.submit(Inbound("t", 5, 10, None, b"{}"))  # assigned: handled
    await rig.delivery.submit(Inbound("t", 6, 10, None, b"{}"))  # not ours: left to its owner
    await rig.settle()
    assert rig.handler.seen == [10]
    assert rig.committer.last(("t", 5)) == 11
    await rig.close()


async def test_slots_bound_the_records_in_flight() -> None:
    handler = Scripted(reply)
    handler.hold(0, 1)
    rig = Rig(handler, max_in_flight=2, read_ahead=0)
    await rig.delivery.submit(record(0))
    await rig.delivery.submit(record(1))
    third = asyncio.create_task(rig.delivery.submit(record(2)))
    await asyncio.sleep(0.01)
    assert not third.done()  # the fetch waits with it
    handler.gates[0].set()
    await asyncio.wait_for(third, 1)
    handler.gates[1].set()
    await rig.settle()
    assert sorted(handler.seen) == [0, 1, 2]
    await rig.close()


def of(organization: str) -> dict[str, bytes]:
    return {HEADER_ORGANIZATION: organization.encode()}


async def test_the_read_ahead_bounds_the_records_that_wait_for_a_slot() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, max_in_flight=1, read_ahead=2)
    for offset in (0, 1, 2):  # 0 runs, 1 and 2 wait: the fetch goes on
        await asyncio.wait_for(rig.delivery.submit(record(offset)), 1)
    fourth = asyncio.create_task(rig.delivery.submit(record(3)))
    await asyncio.sleep(0.01)
    assert not fourth.done()  # three would wait: the fetch waits with it
    assert rig.delivery._waiting_gauge._value.get() == 3
    handler.gates[0].set()
    await asyncio.wait_for(fourth, 1)
    await rig.settle()
    assert handler.seen == [0, 1, 2, 3]
    assert rig.committer.last() == 4
    await rig.close()


async def test_a_tenant_behind_anothers_flood_starts_within_a_turn_and_commits_wait() -> None:
    """Issue 33: one slot, A's record running and twenty more of A's waiting, then B's: B's
    starts after one more of A's, not after all twenty. Its commit waits for A's below it."""
    handler = Scripted(reply)
    handler.hold(0, 21)
    rig = Rig(handler, max_in_flight=1, read_ahead=100, quiet_slots=0)
    for offset in range(21):
        await rig.delivery.submit(record(offset, headers=of("a")))
    await rig.delivery.submit(record(21, headers=of("b")))
    handler.gates[0].set()
    for _ in range(50):
        await asyncio.sleep(0)
    assert handler.seen == [0, 1, 21]  # B waited for one of A's twenty, not for all of them
    assert len(rig.delivery._waiting) == 19
    assert rig.committer.last() == 2  # 21 runs, 2 to 20 wait: no commit passes them
    handler.gates[21].set()
    await rig.settle()
    assert handler.seen[:4] == [0, 1, 21, 2]
    assert sorted(handler.seen) == list(range(22))
    assert rig.committer.last() == 22
    await rig.close()


async def test_a_tenant_with_nothing_running_takes_a_spare_slot_and_a_busy_one_never() -> None:
    """Issue 33: one slot, busy with A's record, twenty more of A's waiting; B's first record
    starts at once in the one spare slot (B has none running), where A's, with one running,
    never start. C's, with the spare taken, waits for a slot in turn."""
    handler = Scripted(reply)
    handler.hold(0, 21, 22)
    rig = Rig(handler, max_in_flight=1, read_ahead=100, quiet_slots=1)
    for offset in range(21):
        await rig.delivery.submit(record(offset, headers=of("a")))
    await rig.delivery.submit(record(21, headers=of("b")))
    await rig.delivery.submit(record(22, headers=of("c")))
    for _ in range(50):
        await asyncio.sleep(0)
    assert handler.seen == [0, 21]  # B beside A's, in the spare; C's waits, and A's
    assert len(rig.delivery._waiting) == 21
    handler.gates[0].set()  # the slot: A's next in turn, then C's
    for _ in range(50):
        await asyncio.sleep(0)
    assert handler.seen == [0, 21, 1, 22]
    handler.gates[21].set()
    handler.gates[22].set()
    await rig.settle()
    assert sorted(handler.seen) == list(range(23))
    assert rig.committer.last() == 23
    assert (rig.delivery._free, rig.delivery._spare, rig.delivery._busy) == (1, 1, {})
    await rig.close()


class Screening(Scripted):
    """:class:`Scripted`, with a screen that answers the records whose value is ``"no"``."""

    def __init__(self, outcome: Callable[[Inbound], Outcome]) -> None:
        super().__init__(outcome)
        self.screened: list[int] = []

    async def screen(self, record: Inbound) -> Reply | None:
        if record.value != b'"no"':
            return None
        self.screened.append(record.offset)
        return Reply("replies", f"no-{record.offset}", Message(text="throttled"))


async def test_a_screened_record_is_answered_on_receipt_without_a_slot() -> None:
    """Issue 33: with the one slot busy and the lanes nearly full, records the screen answers
    are published at once, take no slot and no journal start, and do not count against the
    read ahead once published; commits still wait for the record running below them."""
    handler = Screening(reply)
    handler.hold(0)
    rig = Rig(handler, max_in_flight=1, read_ahead=2)
    await rig.delivery.submit(record(0))
    for offset in range(1, 51):  # fifty refusals: never more than the read ahead in the air
        await asyncio.wait_for(rig.delivery.submit(record(offset, b'"no"')), 1)
        assert rig.delivery._screened <= 2
    await rig.delivery.submit(record(51))
    for _ in range(50):
        await asyncio.sleep(0)
    answered = [s.value for s in rig.publisher.to("replies")]
    assert len(answered) == 50
    assert handler.screened == list(range(1, 51))
    assert handler.seen == [0]  # the screened never reached the handler; 51 waits its turn
    assert ("started", 1) not in rig.journal.calls
    assert rig.committer.last() is None  # 0 still runs: no commit passes it
    handler.gates[0].set()
    await rig.settle()
    assert handler.seen == [0, 51]
    assert rig.committer.last() == 52
    await rig.close()


async def test_refusals_the_broker_has_not_taken_count_against_the_read_ahead() -> None:
    handler = Screening(reply)
    rig = Rig(handler, read_ahead=2)
    taken = asyncio.Event()
    publish = rig.publisher.publish

    async def stalled(topic: str, value: bytes, **options: Any) -> None:
        await taken.wait()
        await publish(topic, value, **options)

    rig.publisher.publish = stalled  # type: ignore[method-assign]
    for offset in range(2):
        await asyncio.wait_for(rig.delivery.submit(record(offset, b'"no"')), 1)
    third = asyncio.create_task(rig.delivery.submit(record(2, b'"no"')))
    await asyncio.sleep(0.01)
    assert not third.done()  # three replies in the air: the fetch waits
    taken.set()
    await asyncio.wait_for(third, 1)
    await rig.settle()
    assert len(rig.publisher.to("replies")) == 3
    assert rig.committer.last() == 3
    await rig.close()


async def test_a_record_revoked_while_it_was_screened_is_left_to_its_next_owner() -> None:
    """The screen is awaited: a revoke in the meantime leaves the record to the partition's
    next owner, neither answered here nor put in a lane (it would run twice)."""
    handler = Screening(reply)
    release = asyncio.Event()
    screen = handler.screen

    async def slow(record: Inbound) -> Reply | None:
        await release.wait()
        return await screen(record)

    handler.screen = slow  # type: ignore[method-assign]
    rig = Rig(handler)
    refused = asyncio.create_task(rig.delivery.submit(record(0, b'"no"')))
    admitted = asyncio.create_task(rig.delivery.submit(record(0, partition=1)))
    await asyncio.sleep(0.01)
    await rig.delivery.revoke([("t", 0), ("t", 1)])
    rig.delivery.assign([("t", 0), ("t", 1)])  # handed back in the same rebalance
    release.set()
    await asyncio.gather(refused, admitted)
    await rig.settle()
    assert (rig.publisher.sent, handler.seen) == ([], [])
    await rig.close()


async def test_a_screen_that_fails_lets_the_record_wait_for_the_handler() -> None:
    handler = Screening(reply)

    async def broken(record: Inbound) -> Reply | None:
        raise RuntimeError("the screen is broken")

    handler.screen = broken  # type: ignore[method-assign]
    rig = Rig(handler)
    await rig.delivery.submit(record(0, b'"no"'))
    await rig.settle()
    assert handler.seen == [0]
    assert [s.value for s in rig.publisher.to("replies")] == [b'{"text":"answer 0"}']
    await rig.close()


async def test_lanes_are_served_in_turn_and_a_record_without_an_organization_shares_one() -> None:
    lanes = Lanes()
    for offset, headers in [
        (0, of("a")),
        (1, of("a")),
        (2, of("a")),
        (3, of("b")),
        (4, {}),
        (5, of("x" * 65)),  # no organization id: the shared lane
        (6, of("b")),
    ]:
        lanes.put(record(offset, headers=headers))
    assert lanes.lanes() == 3
    taken = [lanes.take() for _ in range(7)]
    assert [r.offset for r in taken if r is not None] == [0, 3, 4, 1, 6, 5, 2]
    assert lanes.take() is None
    assert (len(lanes), lanes.bytes) == (0, 0)


async def test_a_revoked_partition_forgets_its_waiting_records_and_commits_what_finished() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, max_in_flight=1, read_ahead=10)
    for offset in range(3):
        await rig.delivery.submit(record(offset))
    await rig.delivery.submit(record(0, partition=1))
    assert len(rig.delivery._waiting) == 3
    asyncio.get_running_loop().call_later(0.05, handler.gates[0].set)
    await rig.delivery.revoke([("t", 0)])
    assert rig.committer.last() == 1  # 0 finished; 1 and 2 never started: its next owner's
    await rig.settle()
    assert handler.seen == [0, 0]  # partition 1's record ran; 1 and 2 of partition 0 never did
    assert len(rig.delivery._waiting) == 0
    await rig.close()


async def test_closing_forgets_the_waiting_records_and_a_waiting_fetch_returns() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, max_in_flight=1, read_ahead=0, drain_timeout_s=0.05)
    await rig.delivery.submit(record(0))
    second = asyncio.create_task(rig.delivery.submit(record(1)))
    await asyncio.sleep(0.01)
    assert not second.done()
    await rig.close()
    await asyncio.wait_for(second, 1)
    assert handler.seen == [0]
    assert rig.committer.last() is None  # 0 was cancelled by the drain deadline, 1 never ran


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


async def test_a_retried_copy_waits_out_its_back_off_and_no_more() -> None:
    rig = Rig(Scripted(lambda r: Done()), retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    rig.delivery.sleep = sleep
    rig.delivery.wall_ms = lambda: 1_000_000

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


async def test_a_record_still_running_when_its_partition_is_revoked_is_cancelled() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, drain_timeout_s=0.05)
    await rig.delivery.submit(record(0, partition=1))
    await rig.delivery.revoke([("t", 1)])
    await rig.settle()
    assert rig.publisher.to("replies") == []  # cancelled: never replied once no longer ours
    assert rig.committer.last(("t", 1)) is None  # and not committed: the next owner has it
    await rig.close()


async def test_close_drains_in_flight_records_and_commits() -> None:
    handler = Scripted(reply)
    handler.hold(1)
    rig = Rig(handler, drain_timeout_s=0.2)
    await rig.delivery.submit(record(0))
    await rig.delivery.submit(record(1))  # never finishes: cancelled at the deadline
    await rig.delivery.close()
    assert rig.committer.last() == 1  # 0 committed, 1 left for the next owner
    await rig.delivery.submit(record(2))  # after close nothing starts
    assert handler.seen == [0, 1]


async def test_a_revoked_partition_drains_and_commits_before_it_is_handed_over() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler)
    await rig.delivery.submit(record(0, partition=1))
    revoking = asyncio.create_task(rig.delivery.revoke([("t", 1)]))
    await asyncio.sleep(0.01)
    assert not revoking.done()  # waits for the record in flight
    handler.gates[0].set()
    await asyncio.wait_for(revoking, 1)
    assert rig.committer.last(("t", 1)) == 1
    await rig.delivery.submit(record(1, partition=1))  # no longer ours: not started
    assert handler.seen == [0]
    await rig.close()


async def test_a_partition_stuck_past_the_limit_is_not_live() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    clock = [100.0]
    rig = Rig(handler)
    rig.delivery.clock = lambda: clock[0]
    await rig.delivery.submit(record(0))
    rig.delivery._refresh_snapshot()
    assert rig.delivery.health().live
    clock[0] += 11.0
    rig.delivery._refresh_snapshot()
    health = rig.delivery.health()
    assert not health.live
    assert health.reason == "t[0] has not moved for 11 s"
    clock[0] += 20.0  # and a monitor that stopped running is not live either
    assert rig.delivery.health().reason.startswith("the event loop has not run")
    handler.gates[0].set()
    await rig.close()


async def test_lag_runs_from_where_a_restart_would_resume_to_the_high_watermark() -> None:
    handler = Scripted(reply)
    handler.hold(1)
    rig = Rig(handler, max_in_flight=3)
    rig.committer.watermarks = {("t", 0): 10}
    rig.delivery.received([record(offset) for offset in range(5)])  # 3 and 4 wait for a slot
    for offset in (0, 1, 2):
        await rig.delivery.submit(record(offset))
    for _ in range(50):
        await asyncio.sleep(0)
    # 0 and 2 finished, 1 holds the partition: a restart resumes at 1; t[1] reported nothing
    assert rig.delivery._lags() == {("t", 0): 9}
    handler.gates[1].set()
    await rig.settle()
    assert rig.delivery._lags() == {("t", 0): 7}  # committable up to 3
    rig.committer.watermarks[("t", 1)] = 5
    assert ("t", 1) not in rig.delivery._lags()  # nothing received there: unknown
    rig.delivery.received([record(4, partition=1)])
    assert rig.delivery._lags()[("t", 1)] == 0
    await rig.delivery.revoke([("t", 0)])
    assert ("t", 0) not in rig.delivery._lags()  # not ours any more
    await rig.close()


# ------------------------------------------------------- the start journal and the solo gate


async def test_every_start_is_journaled_and_commits_are_forgotten() -> None:
    rig = Rig(Scripted(reply))
    for offset in range(3):
        await rig.delivery.submit(record(offset))
    await rig.settle()
    assert [c for c in rig.journal.calls if c[0] == "started"] == [
        ("started", 0),
        ("started", 1),
        ("started", 2),
    ]
    forgotten = [c[1] for c in rig.journal.calls if c[0] == "forget"]
    assert forgotten[-1] == {("t", 0): 3}  # after the commit of 3
    assert not [c for c in rig.journal.calls if c[0].startswith("solo")]
    await rig.close()


async def test_a_suspect_runs_alone_and_is_committed_before_the_next_record_starts() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, FakeJournal(prior={1: Prior(starts=1)}))
    await rig.delivery.submit(record(0))  # a first start, held
    await rig.delivery.submit(record(1))  # started before without an outcome: a suspect
    await rig.delivery.submit(record(2))  # arrives while the suspect waits
    await asyncio.sleep(0.01)
    assert handler.seen == [0]  # the suspect waits for 0; 2 waits for the suspect
    handler.gates[0].set()
    await rig.settle()
    assert handler.seen == [0, 1, 2]
    calls = rig.journal.calls
    # the suspect's solo start, its commit (then forgotten), its solo start taken back
    assert (
        calls.index(("solo_started", 1))
        < calls.index(("forget", {("t", 0): 2}))
        < calls.index(("solo_finished", 1))
    )
    assert rig.delivery.metrics.alone.labels("test")._value.get() == 1
    await rig.close()


async def test_a_suspect_that_crashed_alone_too_often_is_dead_lettered_and_its_caller_told() -> (
    None
):
    handler = Scripted(reply)
    journal = FakeJournal(
        prior={5: Prior(starts=3, solo_crashes=2), 6: Prior(starts=2, solo_crashes=1)}
    )
    rig = Rig(handler, journal, max_crashes=2)
    await rig.delivery.submit(record(5, b"poison"))
    await rig.delivery.submit(record(6))
    await rig.settle()
    assert handler.seen == [6]  # 5 never runs again; 6 has one more chance alone
    [letter] = rig.publisher.to("t.dlt")
    parsed = DeadLetterV1.model_validate_json(letter.value)
    assert (parsed.cause, parsed.offset) == ("crashed_the_consumer", 5)
    assert "took its process down 2 times while it ran alone" in parsed.reason
    [(offset, reason)] = handler.farewells
    assert offset == 5
    assert reason.startswith("crashed_the_consumer: ")
    farewell = [s for s in rig.publisher.to("replies") if b"crashed_the_consumer" in s.value]
    assert len(farewell) == 1
    assert rig.committer.last() == 7
    await rig.close()


async def test_a_record_given_up_on_is_answered_besides_its_dead_letter() -> None:
    def explode(record: Inbound) -> Outcome:
        raise RuntimeError("a bug")

    handler = Scripted(explode)
    rig = Rig(handler, max_attempts=1)
    await rig.delivery.submit(record(3))
    await rig.settle()
    assert [m.cause for m in map(_letter, rig.publisher.to("t.dlt"))] == ["gave_up"]
    assert [offset for offset, _ in handler.farewells] == [3]
    assert handler.farewells[0][1] == "gave_up: an internal error (after 1 attempts)"
    assert "a bug" in _letter(rig.publisher.to("t.dlt")[0]).reason  # the operator's, only
    await rig.close()


async def test_a_record_larger_than_a_producer_of_ours_sends_is_never_read() -> None:
    """Whatever the broker took: what a handler makes of a value grows with it."""
    handler = Scripted(reply)
    rig = Rig(handler)
    await rig.delivery.submit(record(0, value=b"x" * 1_048_577))
    await rig.delivery.submit(record(1))
    await rig.settle()
    [letter] = map(_letter, rig.publisher.to("t.dlt"))
    assert (letter.cause, letter.offset, letter.payload_bytes) == ("too_large", 0, 1_048_577)
    assert handler.seen == [1]
    await rig.close()


def _letter(sent: Sent) -> DeadLetterV1:
    return DeadLetterV1.model_validate_json(sent.value)


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
