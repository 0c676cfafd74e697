"""Retries and dead letters: the records the handler could not answer (docs/delivery.md, steps 5
and 6).

A :class:`~consumers.runtime.records.Retry` re-publishes the record to its own topic with its
attempt count and a not-before time in headers, up to ``max_attempts``; then it is
dead-lettered (``gave_up``), as it is when the broker will never take the copy
(``retry_refused``). The count travels with the record: it survives a restart and a rebalance.
A :class:`~consumers.runtime.records.DeadLetter` publishes a bounded letter to ``<topic>.dlt``;
if the broker refuses it for good, a minimal letter (no payload, no key). A record the runtime
gives up on (``gave_up``, ``crashed_the_consumer``) is also answered when the handler can still
read its reply address (:meth:`~consumers.runtime.transport.RecordHandler.farewell`).

Both publish to our own topics: while the broker may take them later they are tried again in
place, and the minimal letter is tried until it is taken, because skipping it would lose the
record. Meanwhile the record stays in flight and ``/healthz`` reports its partition stuck.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from broker.topics import dead_letter_topic
from consumers.runtime.letters import dead_letter
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_FIRST_POSITION,
    HEADER_LAST_ERROR,
    HEADER_NOT_BEFORE,
    MAX_LAST_ERROR_CHARS,
    DeadLetter,
    Inbound,
    Retry,
    backoff_s,
)
from consumers.runtime.replies import Replies
from consumers.runtime.settings import ConsumerSettings
from consumers.runtime.transport import Publisher, PublishError, RecordHandler
from schemas.envelope import printable

log = logging.getLogger("contextcore.delivery")

GAVE_UP = "gave_up"
CRASHED = "crashed_the_consumer"
RETRY_REFUSED = "retry_refused"
FAREWELL_CAUSES = frozenset({GAVE_UP, CRASHED})
"""The dead letters whose caller is told why (the runtime gave up, not the handler)."""
RETRY_CAUSES = ("timeout", "handler_error", "reply_publish")
"""The runtime's own retry causes (a handler may add its own)."""
_TOLD = {
    "timeout": "it was not handled in time",
    "handler_error": "an internal error",
    "reply_publish": "its reply could not be published",
}
"""What a caller hears of the runtime's retry causes; the dead letter keeps the detail."""


class Retries:
    def __init__(
        self,
        *,
        consumer: str,
        publisher: Publisher,
        handler: RecordHandler,
        replies: Replies,
        settings: ConsumerSettings,
        metrics: RuntimeMetrics,
        max_record_bytes: int,
        wall_ms: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.consumer = consumer
        self.publisher = publisher
        self.handler = handler
        self.replies = replies
        self.settings = settings
        self.metrics = metrics
        self.max_record_bytes = max_record_bytes
        self.wall_ms = wall_ms
        self.sleep = sleep

    async def retry(self, record: Inbound, retry: Retry) -> Retry | DeadLetter:
        """Re-publish ``record`` for a later attempt; the dead letter it becomes when its
        attempts are spent or the broker will never take the copy."""
        attempt = record.attempt
        if attempt >= self.settings.max_attempts:
            return DeadLetter(
                GAVE_UP,
                f"{retry.cause}: {retry.reason} (after {attempt} attempts)",
                told=f"{_TOLD.get(retry.cause, retry.cause)} (after {attempt} attempts)",
            )
        delay_s = backoff_s(
            attempt, base_s=self.settings.retry_backoff_s, max_s=self.settings.retry_backoff_max_s
        )
        last_error = printable(retry.reason)[:MAX_LAST_ERROR_CHARS]
        headers = [
            *record.own_headers(),
            (HEADER_ATTEMPT, str(attempt + 1).encode()),
            (HEADER_NOT_BEFORE, str(self.wall_ms() + int(delay_s * 1000)).encode()),
            (HEADER_FIRST_POSITION, str(record.first_position).encode()),
            (HEADER_LAST_ERROR, last_error.encode("utf-8", "replace")),
        ]
        refused = await self._publish_own(
            "retry", record.topic, record.value or b"", record.key, headers
        )
        if refused is not None:
            return DeadLetter(RETRY_REFUSED, f"{retry.reason}; its retry copy: {refused}")
        self.metrics.retries.labels(self.consumer, retry.cause).inc()
        log.info(
            "%s: retrying %s (attempt %d): %s",
            self.consumer,
            record.position,
            attempt + 1,
            retry.reason,
        )
        return retry

    async def give_up(self, record: Inbound, letter: DeadLetter) -> None:
        """Dead-letter ``record``; when the runtime gave up on it, also tell its caller why."""
        await self.dead_letter(record, letter)
        if letter.cause not in FAREWELL_CAUSES:
            return
        try:
            farewell = self.handler.farewell(record, f"{letter.cause}: {letter.told or ''}")
        except Exception:
            log.exception("%s: no farewell for %s", self.consumer, record.position)
            return
        if farewell is not None:
            await self.replies.farewell(farewell)

    async def dead_letter(self, record: Inbound, letter: DeadLetter) -> None:
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
