"""Commits (consumers/runtime/commits.py) through a member of the in-memory broker: a position
moves past finished records only, commits run in the background, a failed one keeps what is still
ours, and the start journal forgets what was committed."""

from __future__ import annotations

import asyncio

from consumers.runtime.commits import Commits
from consumers.runtime.inmemory import MemoryBroker, MemoryStartJournal
from consumers.runtime.journal import Start
from consumers.runtime.metrics import RuntimeMetrics, Stages
from consumers.runtime.tracker import InFlight
from tests.unit.runtime_fakes import member, record


def commits_of(journal: MemoryStartJournal, metrics: RuntimeMetrics | None = None) -> Commits:
    metrics = metrics or RuntimeMetrics.create()
    in_flight = InFlight()
    in_flight.assign([("t", 0), ("t", 1)])
    return Commits(
        consumer="test",
        in_flight=in_flight,
        journal=journal,
        metrics=metrics,
        stages=Stages(metrics, "test"),
        interval_s=0.0,
        clock=lambda: 0.0,
    )


async def test_a_position_commits_in_the_background_once_the_lowest_record_finished() -> None:
    broker, journal = MemoryBroker(), MemoryStartJournal()
    commits = commits_of(journal)
    tracker = commits.in_flight.tracker(("t", 0))
    assert tracker is not None
    for offset in range(3):
        assert tracker.start(offset, now=0.0)
        await journal.started(Start.of(record(offset)))
    commits.finished(record(1), tracker)
    commits.finished(record(2), tracker)  # 0 still runs: no position yet
    task = commits.start((await member(broker)).committer)
    await asyncio.sleep(0.01)
    assert broker.committed("g") == {}
    commits.finished(record(0), tracker)
    await asyncio.sleep(0.01)
    assert broker.committed("g") == {("t", 0): 3}
    assert journal.starts == {}  # committed: the journal forgets those starts
    task.cancel()


async def test_a_failed_commit_keeps_the_positions_still_ours_for_the_next_try() -> None:
    broker, metrics = MemoryBroker(), RuntimeMetrics.create()
    commits = commits_of(MemoryStartJournal(), metrics)
    left = await member(broker)
    commits.committer = left.committer
    await left.stop()  # the member left its group: its commits are refused
    for partition in (0, 1):
        tracker = commits.in_flight.tracker(("t", partition))
        assert tracker is not None
        assert tracker.start(0, now=0.0)
        commits.finished(record(0, partition=partition), tracker)
    commits.in_flight.revoke([("t", 1)])  # t[1] is not ours any more: its position goes
    assert not await commits.flush()
    assert metrics.commits.labels("test", "failed")._value.get() == 1
    commits.committer = (await member(broker)).committer  # a new member of the group
    assert await commits.flush()
    assert broker.committed("g") == {("t", 0): 1}


async def test_nothing_commits_before_the_member_joined() -> None:
    commits = commits_of(MemoryStartJournal())
    assert not await commits.commit({("t", 0): 5})
    assert not commits.owns(("t", 0))
