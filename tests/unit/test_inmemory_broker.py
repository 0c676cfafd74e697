"""The in-memory broker keeps what the runtime relies on of Kafka (consumers/runtime/inmemory.py):
a key's records in one partition in order, a new member resuming at the group's committed
positions after the old one drained, a paused member fetching nothing, refusals on demand."""

from __future__ import annotations

import pytest

from consumers.runtime.inmemory import MemoryBroker, MemorySource
from consumers.runtime.tracker import TopicPartition
from consumers.runtime.transport import PublishError


class Told:
    """A rebalance listener that notes what it was told."""

    def __init__(self) -> None:
        self.gained: list[TopicPartition] = []
        self.lost: list[TopicPartition] = []

    def assigned(self, partitions: list[TopicPartition]) -> None:
        self.gained.extend(partitions)

    async def revoked(self, partitions: list[TopicPartition]) -> None:
        self.lost.extend(partitions)


def member(broker: MemoryBroker, told: Told | None = None) -> MemorySource:
    return MemorySource(broker, topic="t", group_id="g", rebalance=told or Told())


async def test_a_keys_records_land_in_one_partition_in_order() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 4)
    landed = [await broker.publish("t", str(i).encode(), key=b"k") for i in range(5)]
    assert {p.partition for p in landed} == {landed[0].partition}
    assert [p.offset for p in landed] == [0, 1, 2, 3, 4]


async def test_a_new_member_resumes_at_the_committed_position_after_the_old_one_drained() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    for i in range(4):
        await broker.publish("t", str(i).encode())
    first_told = Told()
    first = member(broker, first_told)
    await first.start()
    assert first_told.gained == [("t", 0)]
    fetched = await first.fetch(10, 100)
    assert [r.offset for r in fetched or []] == [0, 1, 2, 3]
    await first.committer.commit({("t", 0): 2})  # 2 and 3 were not finished

    second = member(broker)
    await second.start()  # takes the partition over: the first member drains first
    assert first_told.lost == [("t", 0)]
    assert not first.committer.owns(("t", 0))
    assert [r.offset for r in await second.fetch(10, 100) or []] == [2, 3]


async def test_a_paused_or_stopped_member_fetches_nothing() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    await broker.publish("t", b"x")
    source = member(broker)
    await source.start()
    source.pause()
    assert await source.fetch(10, 10) == []
    await source.stop()
    assert await source.fetch(10, 10) is None


async def test_refusals_are_injected_then_lifted() -> None:
    broker = MemoryBroker(auto_create=False)
    with pytest.raises(PublishError) as missing:
        await broker.publish("nowhere", b"x")
    assert not missing.value.retriable
    broker.create_topic("t")
    broker.refuse("t", retriable=True, times=1)
    with pytest.raises(PublishError) as refused:
        await broker.publish("t", b"x")
    assert refused.value.retriable
    await broker.publish("t", b"y")
    assert [r.value for r in broker.records("t")] == [b"y"]
