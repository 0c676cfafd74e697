"""The runtime's ports in memory: a broker of this process, for the behaviour suites
(tests/behaviour/) that run every consumer on it and again on the real broker.

:class:`MemoryBroker` keeps what the runtime relies on of Kafka: topics of numbered partitions,
a record's partition chosen by its key, offsets, one committed position per group and partition
(a new member resumes there), a high watermark, pause. A member may be stopped as a process
that dies would be (:meth:`MemorySource.stop` without draining commits nothing more), and the
broker may be told to refuse publishes (:meth:`MemoryBroker.refuse`). What it leaves out: more
than one member per group (a second one takes the partitions over, as a rebalance that revokes
the first), replication, retention, transactions.

:class:`MemoryStartJournal` is the start journal's rules on a dict, shared by the members that
come and go, so a record that "kills" a member is a suspect to the next one.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from broker.topics import TopicSpec
from consumers.runtime.journal import Prior, Start
from consumers.runtime.records import Inbound, Position
from consumers.runtime.tracker import TopicPartition
from consumers.runtime.transport import PublishError, Rebalance


@dataclass
class _Refusal:
    retriable: bool
    times: int | None  # None: until lifted


@dataclass
class _Group:
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    member: MemorySource | None = None


class MemoryBroker:
    """Topics, partitions, offsets and committed positions in this process."""

    def __init__(self, *, auto_create: bool = True) -> None:
        self.auto_create = auto_create
        """A publish to a topic that does not exist creates it (one partition), as Kafka's
        ``auto.create.topics.enable`` does; otherwise it is refused for good."""
        self._logs: dict[str, list[list[Inbound]]] = {}
        self._groups: dict[str, _Group] = {}
        self._refusals: dict[str, _Refusal] = {}
        self._round_robin = itertools.count()
        self._arrived = asyncio.Condition()

    # ------------------------------------------------------------------ topics

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions; an existing topic is left as it is."""
        self._logs.setdefault(name, [[] for _ in range(max(partitions, 1))])

    def partitions(self, topic: str) -> int:
        return len(self._logs.get(topic, ()))

    def records(self, topic: str) -> list[Inbound]:
        """Every record of ``topic``, partition by partition, each in offset order."""
        return [record for log in self._logs.get(topic, ()) for record in log]

    def high_watermark(self, partition: TopicPartition) -> int:
        topic, number = partition
        return len(self._logs[topic][number])

    async def wait_for(self, topic: str, count: int, *, timeout_s: float = 30.0) -> list[Inbound]:
        """The records of ``topic`` once there are at least ``count``."""
        async with asyncio.timeout(timeout_s), self._arrived:
            await self._arrived.wait_for(lambda: len(self.records(topic)) >= count)
        return self.records(topic)

    # ------------------------------------------------------------------ publishing

    def refuse(self, topic: str, *, retriable: bool, times: int | None = None) -> None:
        """Refuse the next ``times`` publishes to ``topic`` (all, until :meth:`accept`)."""
        self._refusals[topic] = _Refusal(retriable, times)

    def accept(self, topic: str) -> None:
        self._refusals.pop(topic, None)

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> Position:
        """Append a record and return where it landed, or raise :class:`PublishError`."""
        refusal = self._refusals.get(topic)
        if refusal is not None:
            if refusal.times is not None:
                refusal.times -= 1
                if refusal.times <= 0:
                    del self._refusals[topic]
            raise PublishError(
                f"the broker refused a record of {topic!r}", retriable=refusal.retriable
            )
        if topic not in self._logs:
            if not self.auto_create:
                raise PublishError(f"topic {topic!r} does not exist", retriable=False)
            self.create_topic(topic)
        logs = self._logs[topic]
        if partition is None:
            n = zlib.crc32(key) if key is not None else next(self._round_robin)
            partition = n % len(logs)
        log = logs[partition]
        log.append(Inbound(topic, partition, len(log), key, value, tuple(headers)))
        async with self._arrived:
            self._arrived.notify_all()
        return Position(topic, partition, len(log) - 1)

    # ------------------------------------------------------------------ groups

    def committed(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed positions (the next offset to read, per partition)."""
        return dict(self._group(group).committed)

    def _group(self, group: str) -> _Group:
        return self._groups.setdefault(group, _Group())

    async def _join(self, member: MemorySource) -> list[TopicPartition]:
        group = self._group(member.group_id)
        previous = group.member
        if previous is not None and previous is not member:
            await previous.revoke_all()  # a rebalance: the old member drains and commits first
        group.member = member
        return [(member.topic, number) for number in range(self.partitions(member.topic))]

    def _leave(self, member: MemorySource) -> None:
        group = self._group(member.group_id)
        if group.member is member:
            group.member = None

    async def _next(
        self, member: MemorySource, max_records: int, timeout_s: float
    ) -> list[Inbound]:
        async with self._arrived:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived.wait_for(lambda: member.waiting() > 0)
            except TimeoutError:
                return []
        return member.take(max_records)


class MemorySource:
    """The one member of its group on a :class:`MemoryBroker` (a :class:`RecordSource`)."""

    def __init__(
        self,
        broker: MemoryBroker,
        *,
        topic: str,
        group_id: str,
        rebalance: Rebalance,
    ) -> None:
        self.broker = broker
        self.topic = topic
        self.group_id = group_id
        self.rebalance = rebalance
        self.committer = _Committer(self)
        self.assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused = False
        self._stopped = False

    async def start(self) -> None:
        self.assignment = await self.broker._join(self)
        committed = self.broker._group(self.group_id).committed
        self._positions = {tp: committed.get(tp, 0) for tp in self.assignment}
        self.rebalance.assigned(list(self.assignment))

    async def fetch(self, max_records: int, timeout_ms: int) -> list[Inbound] | None:
        if self._stopped:
            return None
        if self._paused:
            await asyncio.sleep(timeout_ms / 1000)
            return None if self._stopped else []
        records = await self.broker._next(self, max_records, timeout_ms / 1000)
        return None if self._stopped else records

    def waiting(self) -> int:
        if self._paused or self._stopped:
            return 0
        return sum(self.broker.high_watermark(tp) - at for tp, at in self._positions.items())

    def take(self, max_records: int) -> list[Inbound]:
        """The next records of each held partition in turn, each partition's in order."""
        taken: list[Inbound] = []
        for tp, at in self._positions.items():
            topic, number = tp
            log = self.broker._logs[topic][number]
            batch = log[at : at + max_records - len(taken)]
            taken.extend(batch)
            self._positions[tp] = at + len(batch)
        return taken

    def pause(self) -> None:
        self._paused = True

    async def revoke_all(self) -> None:
        held, self.assignment = self.assignment, []
        if held:
            await self.rebalance.revoked(held)
        self._positions = {}

    async def stop(self) -> None:
        """Leave the group: what was not committed is read again by the next member."""
        self._stopped = True
        self.assignment = []
        self.broker._leave(self)


class _Committer:
    def __init__(self, source: MemorySource) -> None:
        self._source = source

    async def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        source = self._source
        if source._stopped:
            raise PublishError("the member left its group", retriable=False)
        source.broker._group(source.group_id).committed.update(positions)

    def owns(self, partition: TopicPartition) -> bool:
        return partition in self._source.assignment

    def high_watermark(self, partition: TopicPartition) -> int | None:
        if partition not in self._source.assignment:
            return None
        return self._source.broker.high_watermark(partition)


class MemoryPublisher:
    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        await self._broker.publish(topic, value, key=key, headers=headers)


class MemoryTransport:
    """The runtime on a :class:`MemoryBroker` (a :class:`Transport`)."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.sources: list[MemorySource] = []

    async def ensure_topics(self, specs: list[TopicSpec]) -> None:
        for spec in specs:
            self.broker.create_topic(spec.name, spec.partitions)

    def publisher(self, *, client_id: str) -> MemoryPublisher:
        return MemoryPublisher(self.broker)

    def source(
        self,
        *,
        topic: str,
        group_id: str,
        client_id: str,
        fetch_max_wait_ms: int,
        rebalance: Rebalance,
    ) -> MemorySource:
        source = MemorySource(self.broker, topic=topic, group_id=group_id, rebalance=rebalance)
        self.sources.append(source)
        return source


class MemoryStartJournal:
    """The start journal's rules (consumers/runtime/journal.py) on a dict: a start counts, a
    suspect's solo start counts until it finishes, a commit forgets what lies below it, and what
    is known at a position counts only for the digest it was counted for (another digest's start
    begins the count again; its solo start or finish changes nothing)."""

    available = True

    def __init__(self) -> None:
        self.digests: dict[Position, bytes] = {}
        self.starts: dict[Position, int] = {}
        self.solo: dict[Position, int] = {}

    async def started(self, position: Start) -> Prior:
        at = position.position
        if self.digests.get(at) != position.digest:
            self.digests[at], self.starts[at], self.solo[at] = position.digest, 0, 0
        before = self.starts[at]
        self.starts[at] = before + 1
        return Prior(before, self.solo[at])

    async def solo_started(self, position: Start) -> None:
        self._solo(position, 1)

    async def solo_finished(self, position: Start) -> None:
        self._solo(position, -1)

    def _solo(self, position: Start, change: int) -> None:
        at = position.position
        if self.digests.get(at) == position.digest:
            self.solo[at] = max(self.solo[at] + change, 0)

    async def forget(self, positions: Mapping[TopicPartition, int]) -> None:
        for known in (self.digests, self.starts, self.solo):
            for position in list(known):
                committed = positions.get((position.topic, position.partition))
                if committed is not None and position.offset < committed:
                    del known[position]

    async def check(self) -> bool:
        return True
