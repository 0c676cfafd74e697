"""The window (consumers/runtime/window.py): slots, per-organization lanes, the read ahead, the
screen, and what a revoke or a close does to waiting records."""

from __future__ import annotations

import asyncio
from typing import Any

from consumers.runtime.inmemory import MemoryBroker
from consumers.runtime.lanes import Lanes
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    Inbound,
    Reply,
)
from consumers.runtime.tracker import InFlight, PartitionTracker
from consumers.runtime.window import Window
from tests.unit.runtime_fakes import (
    Rig,
    Screening,
    Scripted,
    member,
    of,
    record,
    reply,
    settings,
)


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


async def test_the_read_ahead_bounds_the_records_that_wait_for_a_slot() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    rig = Rig(handler, max_in_flight=1, read_ahead=2)
    for offset in (0, 1, 2):  # 0 runs, 1 and 2 wait: the fetch goes on
        await asyncio.wait_for(rig.delivery.submit(record(offset)), 1)
    fourth = asyncio.create_task(rig.delivery.submit(record(3)))
    await asyncio.sleep(0.01)
    assert not fourth.done()  # three would wait: the fetch waits with it
    assert rig.delivery.metrics.waiting.labels("test")._value.get() == 3
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
    assert len(rig.delivery.window.waiting) == 19
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
    assert len(rig.delivery.window.waiting) == 21
    handler.gates[0].set()  # the slot: A's next in turn, then C's
    for _ in range(50):
        await asyncio.sleep(0)
    assert handler.seen == [0, 21, 1, 22]
    handler.gates[21].set()
    handler.gates[22].set()
    await rig.settle()
    assert sorted(handler.seen) == list(range(23))
    assert rig.committer.last() == 23
    assert (rig.delivery.window.free, rig.delivery.window.spare, rig.delivery.window.busy) == (
        1,
        1,
        {},
    )
    await rig.close()


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
        assert rig.delivery.window.screened <= 2
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
    assert len(rig.delivery.window.waiting) == 3
    asyncio.get_running_loop().call_later(0.05, handler.gates[0].set)
    await rig.delivery.revoke([("t", 0)])
    assert rig.committer.last() == 1  # 0 finished; 1 and 2 never started: its next owner's
    await rig.settle()
    assert handler.seen == [0, 0]  # partition 1's record ran; 1 and 2 of partition 0 never did
    assert len(rig.delivery.window.waiting) == 0
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


# ------------------------------------------ the Window alone, its member on the in-memory broker


class Held:
    """A runner whose records wait until released; what it ran and answered."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.ran: list[int] = []
        self.answered: list[int] = []

    async def deliver(self, record: Inbound, tracker: PartitionTracker) -> None:
        self.ran.append(record.offset)
        await self.release.wait()
        tracker.finish(record.offset)

    async def answer(self, record: Inbound, tracker: PartitionTracker, reply: Reply) -> None:
        self.answered.append(record.offset)
        tracker.finish(record.offset)


async def test_the_window_runs_what_its_slots_take_and_only_the_members_partitions() -> None:
    source = await member(MemoryBroker(), partitions=1)  # t[0] is ours, t[1] is no one's here
    runner, in_flight = Held(), InFlight()
    window = Window(
        consumer="test",
        settings=settings(max_in_flight=2, read_ahead=10),
        metrics=RuntimeMetrics.create(),
        in_flight=in_flight,
        runner=runner,
        owns=source.committer.owns,
        max_intake_bytes=4_096,
        clock=lambda: 0.0,
    )
    for offset in range(3):
        await window.submit(record(offset))  # assigned, though no listener said so yet
    await window.submit(record(0, partition=1))  # not this member's: left to its owner
    await asyncio.sleep(0)
    assert runner.ran == [0, 1]  # two slots; 2 waits its turn
    assert (window.free, len(window.waiting), in_flight.tracker(("t", 1))) == (0, 1, None)
    runner.release.set()
    await window.drain([("t", 0)])
    assert runner.ran == [0, 1, 2]
    assert window.free == 2
    tracker = in_flight.tracker(("t", 0))
    assert tracker is not None
    assert tracker.position == 3
