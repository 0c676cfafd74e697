"""The delivery pipeline: every record ends in exactly one outcome, and then its offset commits.

For one record, in order (docs/delivery.md):

1. A retried copy waits out its back-off (``contextcore-not-before-ms``, never longer than
   its attempt's back-off; a first delivery never waits, whatever its headers say).
2. The start is written to the journal (:mod:`consumers.runtime.journal`). A record started
   before without an outcome runs alone (:class:`~consumers.runtime.gate.SoloGate`); one that
   already took its process down ``max_crashes`` times alone is dead-lettered
   (``crashed_the_consumer``) without running.
3. The handler answers an :data:`~consumers.runtime.records.Outcome` within
   ``handle_timeout_s``. An exception or a timeout is a :class:`Retry`, but for a database that
   does not answer (:class:`~schemas.errors.InfrastructureUnavailable`): the handling is
   tried again in place, no attempt spent, until it answers (``/readyz`` says not ready
   meanwhile, and a partition held too long turns ``/healthz`` red).
4. A :class:`Reply` is serialised and published, and the broker acknowledges it. A reply to a
   topic the reply-topic rule refuses (:mod:`broker.reply_topics`) is never published: the
   record is dead-lettered (``reply_to_refused``). A reply that cannot be serialised or that
   the broker refuses for good (too large, bad topic) is replaced by the handler's fallback
   error reply; failing that, the record is dead-lettered. A publish the broker may accept
   later (retriable) becomes a :class:`Retry`.
5. A :class:`Retry` re-publishes the record to its own topic with its attempt count and a
   not-before time in headers, up to ``max_attempts``; then it is dead-lettered, as it is when
   the broker will never take the copy (too large). The count travels with the record: it
   survives a restart and a rebalance.
6. A :class:`DeadLetter` publishes a bounded letter to ``<topic>.dlt``; if the broker refuses
   it for good, a minimal letter (no payload, no key). A record the runtime gives up on
   (``gave_up``, ``crashed_the_consumer``) is also answered, when the handler can still read
   its reply address and the rule allows it (:meth:`RecordHandler.farewell`): the caller hears
   why instead of waiting.
7. The record is finished; its partition's commit position moves past every finished record
   below the lowest unfinished one, and a background task commits it.

Steps 5 and 6 publish to our own topics: while the broker may take them later they are tried
again in place, and the minimal letter is tried until it is taken, because skipping it would
lose the record. While the broker refuses, that record stays in flight and ``/healthz`` reports
the partition stuck.

Many records are in flight at once (``max_in_flight``). Records received beyond them wait in
lanes, one per organization (:mod:`consumers.runtime.lanes`), up to ``read_ahead`` records and
``read_ahead_bytes``; a free slot takes the next lane in turn, so one tenant's flood does not
hold another tenant's record that arrived behind it. With every slot busy, a record of an
organization with none running takes one of ``quiet_slots`` spares at once: a quiet tenant
does not wait for a slot of the flood to free. A handler may screen a record on its
receipt (:data:`Screen`): a reply it gives there is published beside the slots, so a flood the
handler refuses (a tenant over its rate) never fills the lanes. Each waiting record is tracked
from its receipt, so no commit passes it. When the lanes are full, :meth:`Delivery.submit`
waits, and with it the fetch loop. A revoked partition forgets its waiting records (its next
owner reads them), drains its running ones (up to ``drain_timeout_s``; the rest are
cancelled, uncommitted) and commits their position; shutdown does the same for all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.trace import StatusCode
from prometheus_client import Histogram
from pydantic import BaseModel

from broker.reply_topics import ReplyTopics
from broker.settings import request_bytes
from broker.topics import dead_letter_topic
from broker.tracing import trace_headers
from consumers.runtime import logs, tracing
from consumers.runtime.decoding import REPLY_TO_REFUSED
from consumers.runtime.gate import SoloGate
from consumers.runtime.journal import NoJournal, Start, StartJournal
from consumers.runtime.lanes import Lanes, lane_of
from consumers.runtime.letters import dead_letter
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_FIRST_POSITION,
    HEADER_LAST_ERROR,
    HEADER_NOT_BEFORE,
    MAX_LAST_ERROR_CHARS,
    DeadLetter,
    Done,
    Inbound,
    Outcome,
    Reply,
    Retry,
    Stopwatch,
    backoff_s,
)
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import InFlight, PartitionTracker, TopicPartition
from schemas.envelope import printable
from schemas.errors import ContextcoreError, InfrastructureUnavailable

log = logging.getLogger("contextcore.delivery")


class PublishError(ContextcoreError):
    """The broker did not take a record. ``retriable``: it may take it later."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        self.retriable = retriable
        super().__init__(message)


class Publisher(Protocol):
    async def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
    ) -> None:
        """Publish and wait for the broker's acknowledgement, or raise :class:`PublishError`."""


class Committer(Protocol):
    async def commit(self, positions: Mapping[TopicPartition, int]) -> None:
        """Commit each partition's next offset to read."""

    def owns(self, partition: TopicPartition) -> bool:
        """Whether the group assigned ``partition`` to this member right now."""

    def high_watermark(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as this member's last fetch saw it; ``None`` while
        unknown or not assigned. No request, no side effect."""


class RecordHandler(Protocol):
    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        """One record's outcome. Raising is allowed (it becomes a :class:`Retry`)."""

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """The error reply for a record the runtime gave up on (``reason`` says why), when its
        reply address can still be read; ``None`` when there is nobody to tell."""


Screen = Callable[[Inbound], Awaitable[Reply | None]]
"""A handler's optional ``screen(record)``: a cheap look at a record on its receipt, before it
waits for a slot; a :class:`Reply` answers it there (the build consumer's ``throttled``), with
no slot, no journal start and no handling; ``None`` lets it wait for a slot as any record."""


@dataclass(frozen=True)
class Health:
    live: bool
    reason: str


@dataclass
class _Snapshot:
    taken_at: float = 0.0
    ages: dict[TopicPartition, float] = field(default_factory=dict)
    lags: dict[TopicPartition, int] = field(default_factory=dict)


class Delivery:
    """One consumer's pipeline; see the module docstring for the invariants."""

    def __init__(
        self,
        *,
        consumer: str,
        handler: RecordHandler,
        publisher: Publisher,
        settings: ConsumerSettings,
        max_record_bytes: int,
        metrics: RuntimeMetrics,
        reply_topics: ReplyTopics,
        journal: StartJournal | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.consumer = consumer
        self.handler = handler
        self.publisher = publisher
        self.settings = settings
        self.max_record_bytes = max_record_bytes
        self.max_intake_bytes = request_bytes(max_record_bytes)
        self.metrics = metrics
        self.reply_topics = reply_topics
        """Checked again for every reply, farewells included: a handler's address may come
        from a row stored before the rule, or under other settings."""
        self.journal: StartJournal = journal or NoJournal()
        self.clock = clock
        self.wall_ms = wall_ms
        self.sleep = sleep
        self.in_flight = InFlight()
        self._free = settings.max_in_flight  # slots not running a record
        self._spare = settings.quiet_slots  # free slots for a lane with nothing running
        self._busy: Counter[str] = Counter()  # records running, by lane
        self._waiting = Lanes()  # received, tracked, not started
        self._room = asyncio.Event()  # set when a waiting record started or was forgotten
        self._tasks: dict[TopicPartition, set[asyncio.Task[None]]] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._fetched: dict[TopicPartition, int] = {}  # one past the highest offset received
        self._commit_wanted = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._committer: Committer | None = None
        self._background: list[asyncio.Task[None]] = []
        self._revoking: set[TopicPartition] = set()
        self._closing = False
        self._snapshot = _Snapshot()
        self._gate = SoloGate()
        self._screen: Screen | None = getattr(handler, "screen", None)
        self._screened = 0  # answered on receipt, their replies not yet published
        # the children this consumer observes per record, bound once: ``labels()`` checks and
        # converts its values on every call, a cost per record
        self._in_flight = metrics.in_flight.labels(consumer)
        self._waiting_gauge = metrics.waiting.labels(consumer)
        self._record_seconds = metrics.record_seconds.labels(consumer)
        self._database_waits = metrics.waits.labels(consumer, "database")
        self._run_alone = metrics.alone.labels(consumer)
        self._outcomes = {
            label: metrics.records.labels(consumer, label)
            for label in ("reply", "done", "retry", "dead_letter")
        }
        self._stages: dict[str, Histogram] = {}

    def start_at_zero(
        self,
        topic: str,
        *,
        dead_letter_causes: Iterable[str] = (),
        retry_causes: Iterable[str] = (),
    ) -> None:
        """Create now, at 0, the series of the runtime's own causes and kinds and of the ones
        given (the decoder's, the handler's): a counter that appears with its first increment
        shows Prometheus no increase."""
        for cause in ("timeout", "handler_error", "reply_publish", *retry_causes):
            self.metrics.retries.labels(self.consumer, cause)
        for kind in ("reply", "retry", "dead_letter"):
            self.metrics.publish_failures.labels(self.consumer, kind)
        for result in ("ok", "failed"):
            self.metrics.commits.labels(self.consumer, result)
        for cause in (*RUNTIME_DEAD_LETTER_CAUSES, *dead_letter_causes):
            self.metrics.dead_letters.labels(topic, cause)

    # ------------------------------------------------------------------ lifecycle

    def start(self, committer: Committer) -> None:
        """Begin committing through ``committer`` and refreshing the health snapshot."""
        self._committer = committer
        self._refresh_snapshot()
        if self._positions:  # records that finished before the consumer was ready
            self._commit_wanted.set()
        self._background = [
            asyncio.create_task(self._commit_loop(), name=f"{self.consumer}-commits"),
            asyncio.create_task(self._monitor_loop(), name=f"{self.consumer}-monitor"),
        ]

    async def close(self) -> None:
        """Take no new record, let in-flight ones finish (bounded), commit, stop."""
        self._closing = True
        self._forget_waiting(None)
        await self._drain(list(self._tasks))
        await self._flush_commits()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.in_flight.assign(partitions)

    async def revoke(self, partitions: list[TopicPartition]) -> None:
        """Drain the records of ``partitions`` (bounded) and commit their last position."""
        self._revoking.update(partitions)
        try:
            self._forget_waiting(partitions)
            await self._drain(partitions)
            final = {
                partition: tracker.position
                for partition, tracker in self.in_flight.revoke(partitions).items()
                if tracker.position is not None
            }
            for partition in partitions:
                self._positions.pop(partition, None)
                self._fetched.pop(partition, None)
            if final:
                await self._commit(final)
        finally:
            self._revoking.difference_update(partitions)

    def _forget_waiting(self, partitions: list[TopicPartition] | None) -> None:
        """Forget the waiting records of ``partitions`` (all: ``None``): never started, so never
        committed; the partition's next owner reads them."""
        self._waiting.drop(partitions)
        self._waiting_gauge.set(len(self._waiting))
        self._room.set()

    async def _drain(self, partitions: list[TopicPartition]) -> None:
        """Let the records of ``partitions`` finish, up to ``drain_timeout_s``; cancel the rest.

        A cancelled record is not finished, so not committed: the partition's next owner
        handles it again. Cancelling also stops it from publishing once it is no longer ours.
        """
        tasks = {task for p in partitions for task in self._tasks.get(p, ())}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.settings.drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            log.warning("%s: %d record(s) did not finish in time", self.consumer, len(pending))

    def health(self) -> Health:
        """Live unless the loop stalled or a partition's oldest record is older than allowed."""
        if self._committer is None:
            return Health(True, "starting")
        snapshot = self._snapshot
        stale = self.clock() - snapshot.taken_at
        if stale > max(10.0, 5 * _MONITOR_INTERVAL_S):
            return Health(False, f"the event loop has not run for {stale:.0f} s")
        for (topic, partition), age in sorted(snapshot.ages.items()):
            if age > self.settings.stuck_after_s:
                return Health(False, f"{topic}[{partition}] has not moved for {age:.0f} s")
        return Health(True, "ok")

    def oldest_ages(self) -> dict[TopicPartition, float]:
        """The last snapshot of per-partition ages (safe to read from another thread)."""
        return dict(self._snapshot.ages)

    def lags(self) -> dict[TopicPartition, int]:
        """The last snapshot of per-partition lag: records between where a restart would
        resume and the high watermark (safe to read from another thread)."""
        return dict(self._snapshot.lags)

    # ------------------------------------------------------------------ intake

    def received(self, records: Iterable[Inbound]) -> None:
        """Note a fetched batch before its records wait for slots: the lag counts them."""
        for record in records:
            partition = (record.topic, record.partition)
            if record.offset >= self._fetched.get(partition, -1):
                self._fetched[partition] = record.offset + 1

    async def submit(self, record: Inbound) -> None:
        """Take ``record`` into its lane, start what the free slots take, and return once the
        lanes hold no more than ``read_ahead`` records and ``read_ahead_bytes`` (the fetch
        loop waits meanwhile); never waits for the record's outcome."""
        if self._closing:
            return
        self.received((record,))
        partition = (record.topic, record.partition)
        tracker = self.in_flight.tracker(partition)
        if tracker is None and self._committer is not None and self._committer.owns(partition):
            # assigned, and its record arrived before the listener told us: track it now, or
            # a later record's commit would pass this one
            self.in_flight.assign([partition])
            tracker = self.in_flight.tracker(partition)
        if (
            tracker is None  # not ours (revoked meanwhile): its owner reads it
            or partition in self._revoking
            or not tracker.start(record.offset, self.clock())
        ):
            return
        screened = await self._screened_out(record)
        if (
            self._closing
            or partition in self._revoking
            or self.in_flight.tracker(partition) is not tracker
        ):
            return  # revoked or closed while it was screened: its next owner reads it
        if screened is not None:
            self._answer_on_receipt(record, tracker, screened)
        else:
            self._waiting.put(record)
            self._dispatch()
        while not self._closing and (
            len(self._waiting) + self._screened > self.settings.read_ahead
            or (self._waiting.bytes > self.settings.read_ahead_bytes and len(self._waiting) > 1)
        ):
            self._room.clear()
            await self._room.wait()

    async def _screened_out(self, record: Inbound) -> Reply | None:
        """The handler's answer on receipt, if it has one for ``record``. A screen that fails
        answers nothing: the record waits for a slot, and the handler decides."""
        if self._screen is None or len(record.value or b"") > self.max_intake_bytes:
            return None
        try:
            return await self._screen(record)
        except Exception:
            log.exception("%s: the screen failed on %s", self.consumer, record.position)
            return None

    def _answer_on_receipt(self, record: Inbound, tracker: PartitionTracker, reply: Reply) -> None:
        """Publish a screened record's reply beside the slots (a revoke drains it as a running
        record); finished, and so committed, once the broker took it. These replies count
        against ``read_ahead`` until then, so a broker that stalls them stalls the fetch."""
        self._screened += 1

        async def answer() -> None:
            logs.about_record(record.position)
            try:
                await self._settle(record, reply)
                self._finished(record, tracker)
            except asyncio.CancelledError:
                return  # a drain deadline passed: not finished, so not committed
            except Exception:  # a bug of the runtime: as in _run, the record stays in flight
                log.exception("%s: no outcome for %s", self.consumer, record.position)
            finally:
                self._screened -= 1
                self._room.set()

        partition = (record.topic, record.partition)
        task = asyncio.create_task(answer())
        running = self._tasks.setdefault(partition, set())
        running.add(task)
        task.add_done_callback(running.discard)

    def _dispatch(self) -> None:
        """Start waiting records, lane by lane in turn, while a slot is free; with every slot
        busy, a record of a lane with nothing running takes a spare (``quiet_slots``)."""
        while not self._closing:
            spare = self._free == 0
            if not spare:
                record = self._waiting.take()
            elif self._spare > 0:
                record = self._waiting.take_quiet(self._busy)
            else:
                break
            if record is None:
                break
            self._room.set()
            partition = (record.topic, record.partition)
            tracker = self.in_flight.tracker(partition)
            if tracker is None:  # revoked while it waited
                continue
            if spare:
                self._spare -= 1
            else:
                self._free -= 1
            lane = lane_of(record)
            self._busy[lane] += 1
            self._in_flight.inc()
            task = asyncio.create_task(self._run(record, tracker, lane, spare))
            running = self._tasks.setdefault(partition, set())
            running.add(task)
            task.add_done_callback(running.discard)
        self._waiting_gauge.set(len(self._waiting))

    async def _run(
        self, record: Inbound, tracker: PartitionTracker, lane: str, spare: bool
    ) -> None:
        started = self.clock()
        logs.about_record(record.position)  # this task's log lines name the record
        try:
            await self._deliver(record, tracker)
        except asyncio.CancelledError:
            return  # a drain deadline passed: not finished, so not committed
        except Exception:
            # A bug of the runtime itself: the record stays in flight, its partition stops
            # committing, /healthz turns red and a restart redelivers it. Never silently lost.
            log.exception("%s: no outcome for %s", self.consumer, record.position)
            return
        finally:
            if spare:
                self._spare += 1
            else:
                self._free += 1
            self._busy[lane] -= 1
            if not self._busy[lane]:
                del self._busy[lane]
            self._in_flight.dec()
            self._dispatch()
        self._record_seconds.observe(self.clock() - started)

    def _finished(self, record: Inbound, tracker: PartitionTracker) -> None:
        position = tracker.finish(record.offset)
        if position is not None:
            self._positions[(record.topic, record.partition)] = position
            self._commit_wanted.set()

    # ------------------------------------------------------------------ one record

    async def _deliver(self, record: Inbound, tracker: PartitionTracker) -> None:
        not_before = record.not_before_ms
        if not_before is not None:  # a retried copy: never more than its attempt's back-off
            scheduled = backoff_s(
                record.attempt - 1,
                base_s=self.settings.retry_backoff_s,
                max_s=self.settings.retry_backoff_max_s,
            )
            wait_s = min((not_before - self.wall_ms()) / 1000, scheduled)
            if wait_s > 0:
                await self.sleep(wait_s)
        start = Start.of(record)  # the journal counts these bytes at this position, no others
        prior = await self.journal.started(start)
        if not prior.suspect:
            async with self._gate.shared():
                await self._settle(record)
                self._finished(record, tracker)
            return
        async with self._gate.alone():
            # nothing else runs: if the process dies now, this record killed it
            self._run_alone.inc()
            if prior.solo_crashes >= self.settings.max_crashes:
                reason = (
                    f"the record took its process down {prior.solo_crashes} times while it "
                    f"ran alone (started {prior.starts} times without an outcome)"
                )
                await self._give_up(record, DeadLetter("crashed_the_consumer", reason, told=reason))
                self._outcomes["dead_letter"].inc()
            else:
                await self.journal.solo_started(start)
                try:
                    await self._settle(record)
                except asyncio.CancelledError:  # a drain, not a crash: the start is taken back
                    await asyncio.shield(self.journal.solo_finished(start))
                    raise
            self._finished(record, tracker)
            await self._flush_commits()  # committed before the next suspect runs
            await self.journal.solo_finished(start)

    async def _settle(self, record: Inbound, screened: Reply | None = None) -> None:
        """Handle ``record`` (or take the reply its screen gave) and publish its outcome,
        inside the record's span (its trace is the one its ``traceparent`` names;
        consumers/runtime/tracing.py)."""
        watch = Stopwatch()
        with tracing.consuming(record, self.settings.group_id) as span:
            outcome = screened or await self._handle(record, watch)
            if isinstance(outcome, Reply):
                outcome = await self._reply(outcome, watch)
            if isinstance(outcome, Retry):
                outcome = await self._retry(record, outcome)
            if isinstance(outcome, DeadLetter):
                await self._give_up(record, outcome)
            label = _label(outcome)
            if span.is_recording():
                span.set_attribute("contextcore.outcome", label)
                if isinstance(outcome, Retry | DeadLetter):
                    span.set_status(StatusCode.ERROR, f"{label}: {outcome.cause}")
        self._outcomes[label].inc()
        for stage, seconds in watch.laps.items():
            self._stage(stage).observe(seconds)

    async def _handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        """The handler's outcome; tried again in place while the database does not answer.

        A value larger than any producer of ours sends is never read (what a handler would make
        of it grows with it: JSON, models, an encoder's input), whatever the broker took."""
        size = len(record.value or b"")
        if size > self.max_intake_bytes:
            return DeadLetter(
                TOO_LARGE,
                f"the record is {size:,} bytes, over the {self.max_intake_bytes:,} bytes a "
                "producer of this service's settings sends: not read",
            )
        wait_s = self.settings.retry_backoff_s
        while True:
            try:
                async with asyncio.timeout(self.settings.handle_timeout_s):
                    return await self.handler.handle(record, watch)
            except TimeoutError:
                return Retry("timeout", f"not handled within {self.settings.handle_timeout_s:g} s")
            except InfrastructureUnavailable as error:
                self._database_waits.inc()
                log.warning(
                    "%s: %s waits for the database (%s); trying again in %.1f s",
                    self.consumer,
                    record.position,
                    printable(str(error))[:200],
                    wait_s,
                )
                await self.sleep(wait_s)
                wait_s = min(wait_s * 2, self.settings.unavailable_wait_max_s)
            except Exception as error:
                log.exception("%s: handler failed on %s", self.consumer, record.position)
                return Retry("handler_error", _describe(error))

    async def _give_up(self, record: Inbound, letter: DeadLetter) -> None:
        """Dead-letter ``record``; when the runtime gave up on it, also tell its caller why."""
        await self._dead_letter(record, letter)
        if letter.cause not in _FAREWELL_CAUSES:
            return
        try:
            farewell = self.handler.farewell(record, f"{letter.cause}: {letter.told or ''}")
        except Exception:
            log.exception("%s: no farewell for %s", self.consumer, record.position)
            return
        if farewell is None:
            return
        refused = self.reply_topics.refusal(farewell.topic)
        if refused is not None:
            log.warning("%s: no farewell: %s", self.consumer, refused)
        elif await self._send(farewell, farewell.message, Stopwatch()):
            log.warning("%s: the farewell to %s was not sent", self.consumer, farewell.topic)

    async def _reply(self, reply: Reply, watch: Stopwatch) -> Outcome:
        """Publish ``reply``, or its fallback when it cannot go out; what is left to do when
        neither went out; nothing at all when the rule refuses its topic."""
        refused = self.reply_topics.refusal(reply.topic)
        if refused is not None:
            return DeadLetter(REPLY_TO_REFUSED, f"the reply is not sent: {refused}")
        sent = await self._send(reply, reply.message, watch)
        if sent is None:
            return reply
        if isinstance(sent, Retry):
            return sent
        refused = f"the reply to {reply.topic!r} cannot be sent: {sent}"
        if reply.fallback is None:
            return DeadLetter("reply_refused", refused)
        fallback = reply.fallback(printable(refused))
        sent = await self._send(reply, fallback, Stopwatch())
        if isinstance(sent, Retry):
            return sent
        if sent is not None:
            return DeadLetter("reply_refused", f"{refused}; its error reply too: {sent}")
        log.warning("%s: sent an error reply instead: %s", self.consumer, printable(refused)[:300])
        return Reply(reply.topic, reply.correlation_id, fallback)

    async def _send(self, reply: Reply, message: BaseModel, watch: Stopwatch) -> Retry | str | None:
        """Serialise ``message`` and publish it to ``reply``'s topic: ``None`` once published,
        a :class:`Retry` when the broker may take it later, or why it never will."""
        with watch.stage("serialise"):
            body, problem = self._serialise(message)
        if body is None:
            return problem
        try:
            with watch.stage("publish"):
                await self._publish_reply(reply, body)
        except PublishError as error:
            self.metrics.publish_failures.labels(self.consumer, "reply").inc()
            if error.retriable:
                return Retry("reply_publish", f"the reply to {reply.topic!r} failed: {error}")
            return f"the broker refused it: {error}"
        return None

    def _serialise(self, message: BaseModel) -> tuple[bytes | None, str]:
        try:
            body = message.model_dump_json().encode()
        except Exception as error:  # a value JSON cannot carry (a lone surrogate, …)
            return None, f"it could not be serialised ({_describe(error)})"
        if len(body) > self.max_record_bytes:
            return None, f"it is {len(body)} bytes, over the {self.max_record_bytes}-byte limit"
        return body, ""

    async def _publish_reply(self, reply: Reply, body: bytes) -> None:
        await self.publisher.publish(
            reply.topic,
            body,
            key=None,
            headers=[
                ("content-type", b"application/json"),
                ("correlation_id", reply.correlation_id.encode()),
                *trace_headers(),  # the record's span: the caller's trace continues
            ],
        )

    async def _retry(self, record: Inbound, retry: Retry) -> Retry | DeadLetter:
        """Re-publish ``record`` for a later attempt; the dead letter it becomes when its
        attempts are spent or the broker will never take the copy."""
        attempt = record.attempt
        if attempt >= self.settings.max_attempts:
            return DeadLetter(
                "gave_up",
                f"{retry.cause}: {retry.reason} (after {attempt} attempts)",
                told=f"{_TOLD.get(retry.cause, retry.cause)} (after {attempt} attempts)",
            )
        delay_s = backoff_s(
            attempt,
            base_s=self.settings.retry_backoff_s,
            max_s=self.settings.retry_backoff_max_s,
        )
        headers = [
            *record.own_headers(),
            (HEADER_ATTEMPT, str(attempt + 1).encode()),
            (HEADER_NOT_BEFORE, str(self.wall_ms() + int(delay_s * 1000)).encode()),
            (HEADER_FIRST_POSITION, str(record.first_position).encode()),
            (
                HEADER_LAST_ERROR,
                printable(retry.reason)[:MAX_LAST_ERROR_CHARS].encode("utf-8", "replace"),
            ),
        ]
        refused = await self._publish_own(
            "retry", record.topic, record.value or b"", record.key, headers
        )
        if refused is not None:
            return DeadLetter("retry_refused", f"{retry.reason}; its retry copy: {refused}")
        self.metrics.retries.labels(self.consumer, retry.cause).inc()
        log.info(
            "%s: retrying %s (attempt %d): %s",
            self.consumer,
            record.position,
            attempt + 1,
            retry.reason,
        )
        return retry

    async def _dead_letter(self, record: Inbound, letter: DeadLetter) -> None:
        """Publish the letter; if the broker refuses it for good, a minimal one (no payload, no
        key), tried until it is taken: without it the record would be lost."""
        for minimal in (False, True):
            body, headers = dead_letter(
                record,
                cause=letter.cause,
                reason=letter.reason,
                consumer_group=self.settings.group_id,
                payload_limit=self.settings.dead_letter_payload_bytes,
                max_bytes=self.max_record_bytes,
                minimal=minimal,
            )
            topic = dead_letter_topic(record.topic)
            refused = await self._publish_own(
                "dead_letter", topic, body, None, headers, until_taken=minimal
            )
            if refused is None:
                break
        self.metrics.dead_letters.labels(record.topic, letter.cause).inc()
        log.warning(
            "%s: dead-lettered %s (%s): %s",
            self.consumer,
            record.first_position,
            letter.cause,
            printable(letter.reason)[:300],
        )

    async def _publish_own(
        self,
        kind: str,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        *,
        until_taken: bool = False,
    ) -> str | None:
        """Publish to a topic of ours, trying again while the broker may take it later.

        Returns ``None`` once published, or why the broker will never take it (too large, …);
        with ``until_taken`` even that is tried again, since there is nothing else to try.
        """
        delay = self.settings.retry_backoff_s
        while True:
            try:
                await self.publisher.publish(topic, value, key=key, headers=headers)
                return None
            except PublishError as error:
                self.metrics.publish_failures.labels(self.consumer, kind).inc()
                if not error.retriable and not until_taken:
                    return str(error)
                log.error(
                    "%s: cannot publish a %s to %s (%s); trying again in %.1f s",
                    self.consumer,
                    kind.replace("_", " "),
                    topic,
                    error,
                    delay,
                )
            await self.sleep(delay)
            delay = min(delay * 2, self.settings.retry_backoff_max_s)

    # ------------------------------------------------------------------ commits

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            if not await self._flush_commits():
                await asyncio.sleep(0.5)  # a failed commit is tried again with the next ones
                self._commit_wanted.set()
            elif self.settings.commit_interval_s:
                await asyncio.sleep(self.settings.commit_interval_s)  # coalesce what follows

    async def _flush_commits(self) -> bool:
        if not self._positions:
            return True
        batch, self._positions = self._positions, {}
        if await self._commit(batch):
            return True
        for partition, position in batch.items():  # keep what is still ours for the next try
            if self.in_flight.tracker(partition) is not None:
                self._positions.setdefault(partition, position)
        return False

    async def _commit(self, positions: Mapping[TopicPartition, int]) -> bool:
        if self._committer is None:
            return False
        started = self.clock()
        async with self._commit_lock:
            try:
                await self._committer.commit(positions)
            except Exception as error:
                self.metrics.commits.labels(self.consumer, "failed").inc()
                log.warning("%s: commit failed: %s", self.consumer, _describe(error))
                return False
        self.metrics.commits.labels(self.consumer, "ok").inc()
        self._stage("commit").observe(self.clock() - started)
        await self.journal.forget(positions)  # what is committed is not delivered again
        return True

    def _stage(self, stage: str) -> Histogram:
        child = self._stages.get(stage)
        if child is None:
            child = self._stages[stage] = self.metrics.stage_seconds.labels(self.consumer, stage)
        return child

    # ------------------------------------------------------------------ health

    def _refresh_snapshot(self) -> None:
        now = self.clock()
        self._snapshot = _Snapshot(now, self.in_flight.oldest_ages(now), self._lags())

    def _lags(self) -> dict[TopicPartition, int]:
        """Per owned partition: the high watermark minus where a restart would resume. Left
        out until the member has received a record of the partition in this assignment (the
        resume point is unknown before) or a fetch reported its watermark."""
        lags: dict[TopicPartition, int] = {}
        if self._committer is None:
            return lags
        for partition, tracker in list(self.in_flight.trackers.items()):
            high = self._committer.high_watermark(partition)
            resume = tracker.resume_at(self._fetched.get(partition))
            if high is not None and resume is not None:
                lags[partition] = max(high - resume, 0)
        return lags

    async def _monitor_loop(self) -> None:
        while True:
            self._refresh_snapshot()
            await asyncio.sleep(_MONITOR_INTERVAL_S)


_MONITOR_INTERVAL_S = 1.0
TOO_LARGE = "too_large"
"""A record larger than any producer of ours sends: dead-lettered unread."""
RUNTIME_DEAD_LETTER_CAUSES = (
    "gave_up",
    "crashed_the_consumer",
    "reply_refused",
    REPLY_TO_REFUSED,
    TOO_LARGE,
    "retry_refused",
)
_FAREWELL_CAUSES = frozenset({"gave_up", "crashed_the_consumer"})
_TOLD = {
    "timeout": "it was not handled in time",
    "handler_error": "an internal error",
    "reply_publish": "its reply could not be published",
}
"""What a caller hears of the runtime's retry causes; the dead letter keeps the detail."""


def _label(outcome: object) -> str:
    if isinstance(outcome, Reply):
        return "reply"
    if isinstance(outcome, Done):
        return "done"
    if isinstance(outcome, Retry):
        return "retry"
    return "dead_letter"


def _describe(error: BaseException) -> str:
    text = printable(str(error)).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first[:500]}" if first else type(error).__name__
