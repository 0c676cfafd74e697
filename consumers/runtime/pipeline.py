"""One record, from its slot to its published outcome (docs/delivery.md, steps 1 to 3).

1. A retried copy waits out its back-off (``contextcore-not-before-ms``, never longer than
   its attempt's back-off; a first delivery never waits, whatever its headers say).
2. The start is written to the journal (:mod:`consumers.runtime.journal`). A record started
   before without an outcome runs alone (:class:`~consumers.runtime.gate.SoloGate`), and is
   committed before the next record starts; one that already took its process down
   ``max_crashes`` times alone is dead-lettered (``crashed_the_consumer``) without running.
3. The handler answers an :data:`~consumers.runtime.records.Outcome` within
   ``handle_timeout_s``. An exception or a timeout is a retry, but for a database that does
   not answer (:class:`~schemas.errors.InfrastructureUnavailable`): the handling is tried again
   in place, no attempt spent, until it answers (``/readyz`` says not ready meanwhile, and a
   partition held too long turns ``/healthz`` red). A value larger than any producer of ours
   sends is never read (``too_large``).

Then its outcome is published (:mod:`consumers.runtime.replies`,
:mod:`consumers.runtime.retries`), inside the record's span, and the record is finished
(:mod:`consumers.runtime.commits`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from opentelemetry.trace import StatusCode

from broker.reply_topics import ReplyTopics
from broker.settings import request_bytes
from consumers.runtime import tracing
from consumers.runtime.commits import Commits
from consumers.runtime.gate import SoloGate
from consumers.runtime.journal import Start, StartJournal
from consumers.runtime.metrics import RuntimeMetrics, Stages
from consumers.runtime.records import (
    DeadLetter,
    Done,
    Inbound,
    Outcome,
    Reply,
    Retry,
    Stopwatch,
    backoff_s,
    describe,
)
from consumers.runtime.replies import Replies
from consumers.runtime.retries import CRASHED, Retries
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import PartitionTracker
from consumers.runtime.transport import Publisher, RecordHandler
from schemas.envelope import printable
from schemas.errors import InfrastructureUnavailable

log = logging.getLogger("contextcore.delivery")

TOO_LARGE = "too_large"
"""A record larger than any producer of ours sends: dead-lettered unread."""
OUTCOMES = ("reply", "done", "retry", "dead_letter")


class Pipeline:
    def __init__(
        self,
        *,
        consumer: str,
        handler: RecordHandler,
        publisher: Publisher,
        reply_topics: ReplyTopics,
        commits: Commits,
        journal: StartJournal,
        settings: ConsumerSettings,
        metrics: RuntimeMetrics,
        stages: Stages,
        max_record_bytes: int,
        wall_ms: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        """``reply_topics``: checked again for every reply, farewells included."""
        self.consumer = consumer
        self.handler = handler
        self.commits = commits
        self.journal = journal
        self.settings = settings
        self.max_intake_bytes = request_bytes(max_record_bytes)
        self.wall_ms = wall_ms
        self.sleep = sleep
        self.replies = Replies(
            consumer=consumer,
            publisher=publisher,
            metrics=metrics,
            reply_topics=reply_topics,
            max_record_bytes=max_record_bytes,
        )
        self.retries = Retries(
            consumer=consumer,
            publisher=publisher,
            handler=handler,
            replies=self.replies,
            settings=settings,
            metrics=metrics,
            max_record_bytes=max_record_bytes,
            wall_ms=wall_ms,
            sleep=sleep,
        )
        self._gate = SoloGate()
        self._stages = stages
        self._database_waits = metrics.waits.labels(consumer, "database")
        self._run_alone = metrics.alone.labels(consumer)
        self._outcomes = {label: metrics.records.labels(consumer, label) for label in OUTCOMES}

    async def deliver(self, record: Inbound, tracker: PartitionTracker) -> None:
        """Wait out a retried copy's back-off, journal the start, settle and finish ``record``;
        a suspect (started before without an outcome) alone, and committed at once."""
        await self._back_off(record)
        start = Start.of(record)  # the journal counts these bytes at this position, no others
        prior = await self.journal.started(start)
        if not prior.suspect:
            async with self._gate.shared():
                await self.settle(record)
                self.commits.finished(record, tracker)
            return
        async with self._gate.alone():
            # nothing else runs: if the process dies now, this record killed it
            self._run_alone.inc()
            if prior.solo_crashes >= self.settings.max_crashes:
                reason = (
                    f"the record took its process down {prior.solo_crashes} times while it "
                    f"ran alone (started {prior.starts} times without an outcome)"
                )
                await self.retries.give_up(record, DeadLetter(CRASHED, reason, told=reason))
                self._outcomes["dead_letter"].inc()
            else:
                await self.journal.solo_started(start)
                try:
                    await self.settle(record)
                except asyncio.CancelledError:  # a drain, not a crash: the start is taken back
                    await asyncio.shield(self.journal.solo_finished(start))
                    raise
            self.commits.finished(record, tracker)
            await self.commits.flush()  # committed before the next suspect runs
            await self.journal.solo_finished(start)

    async def answer(self, record: Inbound, tracker: PartitionTracker, reply: Reply) -> None:
        """Publish the reply a screen gave ``record`` on its receipt, and finish it."""
        await self.settle(record, reply)
        self.commits.finished(record, tracker)

    async def settle(self, record: Inbound, screened: Reply | None = None) -> None:
        """Handle ``record`` (or take the reply its screen gave) and publish its outcome,
        inside the record's span (its trace is the one its ``traceparent`` names;
        consumers/runtime/tracing.py)."""
        watch = Stopwatch()
        with tracing.consuming(record, self.settings.group_id) as span:
            outcome = screened or await self.handle(record, watch)
            if isinstance(outcome, Reply):
                outcome = await self.replies.publish(outcome, watch)
            if isinstance(outcome, Retry):
                outcome = await self.retries.retry(record, outcome)
            if isinstance(outcome, DeadLetter):
                await self.retries.give_up(record, outcome)
            label = _label(outcome)
            if span.is_recording():
                span.set_attribute("contextcore.outcome", label)
                if isinstance(outcome, Retry | DeadLetter):
                    span.set_status(StatusCode.ERROR, f"{label}: {outcome.cause}")
        self._outcomes[label].inc()
        for stage, seconds in watch.laps.items():
            self._stages(stage).observe(seconds)

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
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
                return Retry("handler_error", describe(error))

    async def _back_off(self, record: Inbound) -> None:
        """A retried copy waits until its not-before time, never more than its attempt's
        back-off (the header is anyone's to set); a first delivery never waits."""
        not_before = record.not_before_ms
        if not_before is None:
            return
        scheduled = backoff_s(
            record.attempt - 1,
            base_s=self.settings.retry_backoff_s,
            max_s=self.settings.retry_backoff_max_s,
        )
        wait_s = min((not_before - self.wall_ms()) / 1000, scheduled)
        if wait_s > 0:
            await self.sleep(wait_s)


def _label(outcome: Outcome) -> str:
    if isinstance(outcome, Reply):
        return "reply"
    if isinstance(outcome, Done):
        return "done"
    if isinstance(outcome, Retry):
        return "retry"
    return "dead_letter"
