"""The monitor (consumers/runtime/monitor.py): liveness, ages and lags from snapshots."""

from __future__ import annotations

import asyncio

from consumers.runtime.health import Health
from consumers.runtime.inmemory import MemoryBroker
from consumers.runtime.monitor import Monitor
from consumers.runtime.tracker import InFlight
from tests.unit.runtime_fakes import (
    Rig,
    Scripted,
    member,
    record,
    reply,
)


async def test_a_partition_stuck_past_the_limit_is_not_live() -> None:
    handler = Scripted(reply)
    handler.hold(0)
    clock = [100.0]
    rig = Rig(handler, clock=lambda: clock[0])
    await rig.delivery.submit(record(0))
    rig.delivery.monitor.refresh()
    assert rig.delivery.health().live
    clock[0] += 11.0
    rig.delivery.monitor.refresh()
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
    assert rig.delivery.monitor.current_lags() == {("t", 0): 9}
    handler.gates[1].set()
    await rig.settle()
    assert rig.delivery.monitor.current_lags() == {("t", 0): 7}  # committable up to 3
    rig.committer.watermarks[("t", 1)] = 5
    assert ("t", 1) not in rig.delivery.monitor.current_lags()  # nothing received there: unknown
    rig.delivery.received([record(4, partition=1)])
    assert rig.delivery.monitor.current_lags()[("t", 1)] == 0
    await rig.delivery.revoke([("t", 0)])
    assert ("t", 0) not in rig.delivery.monitor.current_lags()  # not ours any more
    await rig.close()


async def test_lag_and_health_read_the_members_watermark_on_the_in_memory_broker() -> None:
    broker, now = MemoryBroker(), [0.0]
    source = await member(broker)
    for _ in range(5):
        await broker.publish("t", b"{}", partition=0)
    in_flight = InFlight()
    in_flight.assign([("t", 0), ("t", 1)])
    monitor = Monitor(consumer="test", in_flight=in_flight, stuck_after_s=10, clock=lambda: now[0])
    assert monitor.health() == Health(True, "starting")  # no member yet
    task = monitor.start(source.committer)
    tracker = in_flight.tracker(("t", 0))
    assert tracker is not None
    monitor.received(source.take(3))  # offsets 0, 1, 2 fetched
    for offset in range(3):
        tracker.start(offset, now=0.0)
    tracker.finish(0)
    monitor.refresh()
    assert monitor.lags() == {("t", 0): 4}  # a restart resumes at 1; the watermark is 5
    assert monitor.health() == Health(True, "ok")
    now[0] = 11.0
    monitor.refresh()
    assert monitor.health() == Health(False, "t[0] has not moved for 11 s")
    monitor.forget([("t", 0)])
    in_flight.revoke([("t", 0)])
    monitor.refresh()
    assert monitor.lags() == {}
    task.cancel()
