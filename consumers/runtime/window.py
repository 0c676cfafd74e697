"""The window: which received records run, and when (docs/delivery.md, "Many records in flight").

Up to ``max_in_flight`` records run at once, each in a slot. Records received beyond them wait
in lanes, one per organization (:mod:`consumers.runtime.lanes`), up to ``read_ahead`` records
and ``read_ahead_bytes``; a free slot takes the next lane in turn, so one tenant's flood does
not hold another tenant's record that arrived behind it. With every slot busy, a record of an
organization with none running takes one of ``quiet_slots`` spares at once: a quiet tenant
does not wait for a slot of the flood to free. A handler may screen a record on its receipt
(:data:`~consumers.runtime.transport.Screen`): a reply it gives there is published beside the
slots, so a flood the handler refuses (a tenant over its rate) never fills the lanes.

Each waiting record is tracked from its receipt, so no commit passes it. When the lanes are
full, :meth:`Window.submit` waits, and with it the fetch loop. A revoked partition forgets its
waiting records (its next owner reads them) and drains its running ones, up to
``drain_timeout_s``; the rest are cancelled, so neither finished nor committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from consumers.runtime import logs
from consumers.runtime.lanes import Lanes, lane_of
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import Inbound, Reply
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import InFlight, PartitionTracker, TopicPartition
from consumers.runtime.transport import Screen

log = logging.getLogger("contextcore.delivery")


class Runner(Protocol):
    """What takes a record from its slot to its outcome (consumers/runtime/pipeline.py)."""

    async def deliver(self, record: Inbound, tracker: PartitionTracker) -> None:
        """Take a started record to its published outcome, and finish it."""

    async def answer(self, record: Inbound, tracker: PartitionTracker, reply: Reply) -> None:
        """Publish the reply a screen gave ``record`` on its receipt, and finish it."""


class Window:
    def __init__(
        self,
        *,
        consumer: str,
        settings: ConsumerSettings,
        metrics: RuntimeMetrics,
        in_flight: InFlight,
        runner: Runner,
        owns: Callable[[TopicPartition], bool],
        screen: Screen | None = None,
        max_intake_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        """``owns``: whether the group assigned a partition to this member (a record may
        arrive before the listener says so). ``max_intake_bytes``: no screen reads more."""
        self.consumer = consumer
        self.settings = settings
        self.in_flight = in_flight
        self.runner = runner
        self.owns = owns
        self.screen = screen
        self.max_intake_bytes = max_intake_bytes
        self.clock = clock
        self.closing = False
        self.revoking: set[TopicPartition] = set()
        self.free = settings.max_in_flight  # slots not running a record
        self.spare = settings.quiet_slots  # free slots for a lane with nothing running
        self.busy: Counter[str] = Counter()  # records running, by lane
        self.waiting = Lanes()  # received, tracked, not started
        self.screened = 0  # answered on receipt, their replies not yet published
        self.tasks: dict[TopicPartition, set[asyncio.Task[None]]] = {}
        self._room = asyncio.Event()  # set when a waiting record started or was forgotten
        # bound once: ``labels()`` checks and converts its values on every call
        self._in_flight = metrics.in_flight.labels(consumer)
        self._waiting_gauge = metrics.waiting.labels(consumer)
        self._record_seconds = metrics.record_seconds.labels(consumer)

    async def submit(self, record: Inbound) -> None:
        """Take ``record`` into its lane, start what the free slots take, and return once the
        lanes hold no more than ``read_ahead`` records and ``read_ahead_bytes`` (the fetch
        loop waits meanwhile); never waits for the record's outcome."""
        if self.closing:
            return
        partition = (record.topic, record.partition)
        tracker = self._tracker(partition)
        if (
            tracker is None  # not ours (revoked meanwhile): its owner reads it
            or partition in self.revoking
            or not tracker.start(record.offset, self.clock())
        ):
            return
        screened = await self._screened_out(record)
        if (
            self.closing
            or partition in self.revoking
            or self.in_flight.tracker(partition) is not tracker
        ):
            return  # revoked or closed while it was screened: its next owner reads it
        if screened is not None:
            self._answer_on_receipt(record, tracker, screened)
        else:
            self.waiting.put(record)
            self._dispatch()
        settings = self.settings
        while not self.closing and (
            len(self.waiting) + self.screened > settings.read_ahead
            or (self.waiting.bytes > settings.read_ahead_bytes and len(self.waiting) > 1)
        ):
            self._room.clear()
            await self._room.wait()

    def forget_waiting(self, partitions: list[TopicPartition] | None) -> None:
        """Forget the waiting records of ``partitions`` (all: ``None``): never started, so never
        committed; the partition's next owner reads them."""
        self.waiting.drop(partitions)
        self._waiting_gauge.set(len(self.waiting))
        self._room.set()

    async def drain(self, partitions: Iterable[TopicPartition]) -> None:
        """Let the records of ``partitions`` finish, up to ``drain_timeout_s``; cancel the rest.

        A cancelled record is not finished, so not committed: the partition's next owner
        handles it again. Cancelling also stops it from publishing once it is no longer ours.
        """
        tasks = {task for p in partitions for task in self.tasks.get(p, ())}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.settings.drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            log.warning("%s: %d record(s) did not finish in time", self.consumer, len(pending))

    def _tracker(self, partition: TopicPartition) -> PartitionTracker | None:
        tracker = self.in_flight.tracker(partition)
        if tracker is None and self.owns(partition):
            # assigned, and its record arrived before the listener told us: track it now, or
            # a later record's commit would pass this one
            self.in_flight.assign([partition])
            tracker = self.in_flight.tracker(partition)
        return tracker

    async def _screened_out(self, record: Inbound) -> Reply | None:
        """The handler's answer on receipt, if it has one for ``record``. A screen that fails
        answers nothing: the record waits for a slot, and the handler decides."""
        if self.screen is None or len(record.value or b"") > self.max_intake_bytes:
            return None
        try:
            return await self.screen(record)
        except Exception:
            log.exception("%s: the screen failed on %s", self.consumer, record.position)
            return None

    def _answer_on_receipt(self, record: Inbound, tracker: PartitionTracker, reply: Reply) -> None:
        """Publish a screened record's reply beside the slots (a revoke drains it as a running
        record); finished, and so committed, once the broker took it. These replies count
        against ``read_ahead`` until then, so a broker that stalls them stalls the fetch."""
        self.screened += 1

        async def answer() -> None:
            logs.about_record(record.position)
            try:
                await self.runner.answer(record, tracker, reply)
            except asyncio.CancelledError:
                return  # a drain deadline passed: not finished, so not committed
            except Exception:  # a bug of the runtime: as in _run, the record stays in flight
                log.exception("%s: no outcome for %s", self.consumer, record.position)
            finally:
                self.screened -= 1
                self._room.set()

        self._track(record, asyncio.create_task(answer()))

    def _dispatch(self) -> None:
        """Start waiting records, lane by lane in turn, while a slot is free; with every slot
        busy, a record of a lane with nothing running takes a spare (``quiet_slots``)."""
        while not self.closing:
            spare = self.free == 0
            if not spare:
                record = self.waiting.take()
            elif self.spare > 0:
                record = self.waiting.take_quiet(self.busy)
            else:
                break
            if record is None:
                break
            self._room.set()
            tracker = self.in_flight.tracker((record.topic, record.partition))
            if tracker is None:  # revoked while it waited
                continue
            if spare:
                self.spare -= 1
            else:
                self.free -= 1
            lane = lane_of(record)
            self.busy[lane] += 1
            self._in_flight.inc()
            self._track(record, asyncio.create_task(self._run(record, tracker, lane, spare)))
        self._waiting_gauge.set(len(self.waiting))

    def _track(self, record: Inbound, task: asyncio.Task[None]) -> None:
        running = self.tasks.setdefault((record.topic, record.partition), set())
        running.add(task)
        task.add_done_callback(running.discard)

    async def _run(
        self, record: Inbound, tracker: PartitionTracker, lane: str, spare: bool
    ) -> None:
        started = self.clock()
        logs.about_record(record.position)  # this task's log lines name the record
        try:
            await self.runner.deliver(record, tracker)
        except asyncio.CancelledError:
            return  # a drain deadline passed: not finished, so not committed
        except Exception:
            # A bug of the runtime itself: the record stays in flight, its partition stops
            # committing, /healthz turns red and a restart redelivers it. Never silently lost.
            log.exception("%s: no outcome for %s", self.consumer, record.position)
            return
        finally:
            if spare:
                self.spare += 1
            else:
                self.free += 1
            self.busy[lane] -= 1
            if not self.busy[lane]:
                del self.busy[lane]
            self._in_flight.dec()
            self._dispatch()
        self._record_seconds.observe(self.clock() - started)
