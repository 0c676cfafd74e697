"""The delivery: every record ends in exactly one outcome, and then its offset commits.

For one record, in order (docs/delivery.md), each step in its module:

1. The window gives it a slot (:mod:`consumers.runtime.window`): many records run at once, the
   rest wait in per-organization lanes, a screen may answer one on its receipt.
2. Its start is journaled, a suspect runs alone, and the handler answers its outcome
   (:mod:`consumers.runtime.pipeline`).
3. A reply is published, or its fallback (:mod:`consumers.runtime.replies`).
4. A retry re-publishes the record with its attempt count; a dead letter is published to
   ``<topic>.dlt``, and the caller of a record given up on is told (:mod:`consumers.runtime.
   retries`).
5. The record is finished; its partition's commit position moves past every finished record
   below the lowest unfinished one, and a background task commits it
   (:mod:`consumers.runtime.commits`).

:class:`Delivery` composes them, and the monitor (:mod:`consumers.runtime.monitor`: liveness,
ages, lags). A revoked partition forgets its waiting records (its next owner reads them),
drains its running ones (up to ``drain_timeout_s``; the rest are cancelled, uncommitted) and
commits their position; shutdown does the same for all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from broker.reply_topics import ReplyTopics
from consumers.runtime import replies, retries
from consumers.runtime.commits import Commits
from consumers.runtime.health import Health
from consumers.runtime.journal import NoJournal, StartJournal
from consumers.runtime.metrics import RuntimeMetrics, Stages
from consumers.runtime.monitor import Monitor
from consumers.runtime.pipeline import TOO_LARGE, Pipeline
from consumers.runtime.records import Inbound
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.tracker import InFlight, TopicPartition
from consumers.runtime.transport import Committer, Publisher, RecordHandler
from consumers.runtime.window import Window

RUNTIME_DEAD_LETTER_CAUSES = (
    retries.GAVE_UP,
    retries.CRASHED,
    *replies.DEAD_LETTER_CAUSES,
    TOO_LARGE,
    retries.RETRY_REFUSED,
)
"""The dead-letter causes of the runtime itself, beside the decoder's and the handler's."""


class Delivery:
    """One consumer's delivery; see the module docstring for the invariants. ``reply_topics``:
    the topics a reply may go to, checked again for every reply, farewells included."""

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
        self.metrics = metrics
        self.in_flight = InFlight()
        stages = Stages(metrics, consumer)
        self.commits = Commits(
            consumer=consumer,
            in_flight=self.in_flight,
            journal=journal or NoJournal(),
            metrics=metrics,
            stages=stages,
            interval_s=settings.commit_interval_s,
            clock=clock,
        )
        self.monitor = Monitor(
            consumer=consumer,
            in_flight=self.in_flight,
            stuck_after_s=settings.stuck_after_s,
            clock=clock,
        )
        self.pipeline = Pipeline(
            consumer=consumer,
            handler=handler,
            publisher=publisher,
            reply_topics=reply_topics,
            commits=self.commits,
            journal=self.commits.journal,
            settings=settings,
            metrics=metrics,
            stages=stages,
            max_record_bytes=max_record_bytes,
            wall_ms=wall_ms,
            sleep=sleep,
        )
        self.window = Window(
            consumer=consumer,
            settings=settings,
            metrics=metrics,
            in_flight=self.in_flight,
            runner=self.pipeline,
            owns=self.commits.owns,
            screen=getattr(handler, "screen", None),
            max_intake_bytes=self.pipeline.max_intake_bytes,
            clock=clock,
        )
        self._background: list[asyncio.Task[None]] = []

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
        for cause in (*retries.RETRY_CAUSES, *retry_causes):
            self.metrics.retries.labels(self.consumer, cause)
        for kind in ("reply", "retry", "dead_letter"):
            self.metrics.publish_failures.labels(self.consumer, kind)
        for result in ("ok", "failed"):
            self.metrics.commits.labels(self.consumer, result)
        for cause in (*RUNTIME_DEAD_LETTER_CAUSES, *dead_letter_causes):
            self.metrics.dead_letters.labels(topic, cause)

    def start(self, committer: Committer) -> None:
        """Begin committing through ``committer`` and refreshing the health snapshot."""
        self._background = [self.commits.start(committer), self.monitor.start(committer)]

    async def close(self) -> None:
        """Take no new record, let in-flight ones finish (bounded), commit, stop."""
        self.window.closing = True
        self.window.forget_waiting(None)
        await self.window.drain(list(self.window.tasks))
        await self.commits.flush()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.in_flight.assign(partitions)

    async def revoke(self, partitions: list[TopicPartition]) -> None:
        """Drain the records of ``partitions`` (bounded) and commit their last position."""
        self.window.revoking.update(partitions)
        try:
            self.window.forget_waiting(partitions)
            await self.window.drain(partitions)
            final = {
                partition: tracker.position
                for partition, tracker in self.in_flight.revoke(partitions).items()
                if tracker.position is not None
            }
            self.commits.forget(partitions)
            self.monitor.forget(partitions)
            if final:
                await self.commits.commit(final)
        finally:
            self.window.revoking.difference_update(partitions)

    def received(self, records: Iterable[Inbound]) -> None:
        """Note a fetched batch before its records wait for slots: the lag counts them."""
        self.monitor.received(records)

    async def submit(self, record: Inbound) -> None:
        """Take ``record`` into the window; returns once the lanes have room for the next
        (the fetch loop waits meanwhile), never waits for the record's outcome."""
        if self.window.closing:
            return
        self.monitor.received((record,))
        await self.window.submit(record)

    def health(self) -> Health:
        return self.monitor.health()

    def oldest_ages(self) -> dict[TopicPartition, float]:
        return self.monitor.oldest_ages()

    def lags(self) -> dict[TopicPartition, int]:
        return self.monitor.lags()
