"""The delivery composed, against tiny fakes of its ports (tests/unit/runtime_fakes.py).

What these prove is the runtime's own logic: one outcome per record, commits that never pass an
unfinished record, the start journal and the solo gate, drains; and the pure pieces (tracker,
back-off, letters, retry headers). Each part has its own tests (test_window.py, test_pipeline.py,
test_replies.py, test_retries.py, test_commits.py, test_monitor.py); the same paths run through
the real broker in ``tests/integration/test_delivery_runtime.py``.
"""

from __future__ import annotations

import asyncio
import hashlib

from consumers.runtime.journal import Prior
from consumers.runtime.letters import dead_letter
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_FIRST_POSITION,
    HEADER_NOT_BEFORE,
    Inbound,
    backoff_s,
)
from consumers.runtime.tracker import PartitionTracker
from schemas.envelope import DeadLetterV1
from tests.unit.runtime_fakes import (
    FakeJournal,
    Rig,
    Scripted,
    record,
    reply,
)


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
