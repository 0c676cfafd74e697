"""The build consumer: ``ContextRequest`` + ``ContextPolicy`` in, ``ContextBrief`` or error out.

Delivery semantics, in order of the handler:

1. Decode and validate the record. A record that fails gets an error reply on its ``reply_to``
   when that topic and the correlation id can be read; otherwise a dead-letter record on
   ``<topic>.dlt`` with the original topic/partition/offset and the reason.
2. Build the brief and publish the reply, waiting for the broker's acknowledgement.
3. Only then return, and faststream commits the offset (``AckPolicy.NACK_ON_ERROR``): a crash
   before the commit redelivers the request, so a client may see one reply twice, always with the
   request's correlation id. At least once, never lost.

A reply that cannot be published is retried by redelivery (the handler raises, faststream seeks
back) up to ``max_publish_attempts``; then the request goes to the dead-letter topic, so one bad
``reply_to`` can never stall a partition. The builder itself never raises into the consumer: any
unexpected exception becomes an ``internal_error`` reply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from faststream.kafka import KafkaBroker, KafkaMessage
from faststream.middlewares import AckPolicy
from pydantic import ValidationError

from consumers.metrics import BuildMetrics
from contextcore.builder import ContextBuilder, RequiredContextSourceError
from contextcore.errors import validation_lines
from contextcore.registry import ContextSourceRegistry, PolicyError
from contextcore.settings import Settings, dead_letter_topic
from schemas.build import (
    BuildReplyV1,
    BuildRequestV1,
    DeadLetterV1,
    ErrorInfo,
    parse_build_request,
    reply_address,
)

log = logging.getLogger("contextcore.build")


@dataclass(frozen=True)
class Reply:
    topic: str
    correlation_id: str
    message: BuildReplyV1


@dataclass(frozen=True)
class DeadLetter:
    reason: str


async def decide(
    value: bytes | None, registry: ContextSourceRegistry, builder: ContextBuilder
) -> Reply | DeadLetter:
    """What to publish for one record; no I/O but the injected builder's."""
    try:
        data: Any = json.loads(value or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return DeadLetter(f"not JSON: {error}")
    try:
        envelope, dropped = parse_build_request(data)
    except ValidationError as error:
        address = reply_address(data)
        if address is None:
            return DeadLetter(
                "invalid build request without a usable reply_to/correlation_id: "
                + "; ".join(validation_lines(error))[:2000]
            )
        topic, correlation_id = address
        info = ErrorInfo(
            code="invalid_request",
            message="the build request is invalid",
            details=validation_lines(error),
        )
        return Reply(topic, correlation_id, BuildReplyV1.failed(correlation_id, info))
    return Reply(
        envelope.reply_to,
        envelope.correlation_id,
        await answer(envelope, dropped, registry, builder),
    )


async def answer(
    envelope: BuildRequestV1,
    dropped: int,
    registry: ContextSourceRegistry,
    builder: ContextBuilder,
) -> BuildReplyV1:
    """Admission, the resume rule, then the build; every outcome is a reply."""
    correlation_id = envelope.correlation_id
    try:
        registry.validate_policy(envelope.policy)  # admission at the message boundary
    except PolicyError as error:
        return BuildReplyV1.failed(
            correlation_id,
            ErrorInfo(
                code="policy_rejected",
                message="the context policy fails admission",
                details=[str(error)],
            ),
        )
    if envelope.resumed_after_wait and not envelope.policy.refresh_on_resume:
        return BuildReplyV1(correlation_id=correlation_id, status="reuse_previous")
    try:
        brief = await builder.build(envelope.request, envelope.policy)
    except RequiredContextSourceError as error:
        return BuildReplyV1.failed(
            correlation_id,
            ErrorInfo(
                code="required_source_failed",
                message=str(error),
                details=[f"{s}: {r}" for s, r in zip(error.sources, error.reasons, strict=True)],
            ),
        )
    except Exception as error:  # a bug in a builder must not stall the partition
        log.exception("build failed for correlation id %s", correlation_id)
        return BuildReplyV1.failed(
            correlation_id,
            ErrorInfo(code="internal_error", message=f"{type(error).__name__}: {error}"),
        )
    return BuildReplyV1.ok(correlation_id, brief, dropped_entities=dropped)


async def _raw_body(msg: KafkaMessage) -> bytes:
    """Hand the handler the record's bytes: validation, and its failures, are ours to answer."""
    return msg.body


class BuildConsumer:
    """Wires :func:`decide` to a faststream Kafka subscriber with at-least-once commits."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: ContextSourceRegistry,
        builder: ContextBuilder,
        metrics: BuildMetrics | None = None,
        max_publish_attempts: int = 5,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.builder = builder
        self.metrics = metrics or BuildMetrics.create()
        self.max_publish_attempts = max_publish_attempts
        self._attempts: dict[tuple[str, int, int], int] = {}
        self.broker = KafkaBroker(
            settings.require_bootstrap_servers(),
            acks="all",
            enable_idempotence=False,  # Tansu refuses idempotent producers; consumers dedupe
            client_id="contextcore-build",
            logger=log,
        )
        self.broker.subscriber(
            settings.topic_build_request,
            group_id=settings.build_group_id,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            ack_policy=AckPolicy.NACK_ON_ERROR,
            decoder=_raw_body,
        )(self.handle)

    async def handle(self, body: bytes, msg: KafkaMessage) -> None:
        record = msg.raw_message
        assert not isinstance(record, tuple)
        started = time.perf_counter()
        outcome = await decide(body, self.registry, self.builder)
        position = (record.topic, record.partition, record.offset)
        if isinstance(outcome, Reply):
            try:
                await self.broker.publish(
                    outcome.message.model_dump_json().encode(),
                    topic=outcome.topic,
                    correlation_id=outcome.correlation_id,
                    headers={"content-type": "application/json"},
                )
            except KafkaError as error:
                attempts = self._attempts.get(position, 0) + 1
                if error.retriable and attempts < self.max_publish_attempts:
                    self._attempts[position] = attempts
                    self.metrics.publish_retries.inc()
                    await asyncio.sleep(min(0.1 * 2**attempts, 2.0))
                    raise  # faststream seeks back: the record is redelivered, not committed
                outcome = DeadLetter(
                    f"reply to {outcome.topic!r} failed after {attempts} attempt(s): {error!r}"
                )
            else:
                self.metrics.requests.labels(outcome=outcome.message.status).inc()
        if isinstance(outcome, DeadLetter):
            await self._dead_letter(
                record.topic, record.partition, record.offset, body, outcome.reason
            )
        self._attempts.pop(position, None)
        self.metrics.duration.observe(time.perf_counter() - started)

    async def _dead_letter(
        self, topic: str, partition: int, offset: int, value: bytes | None, reason: str
    ) -> None:
        letter = DeadLetterV1(
            topic=topic,
            partition=partition,
            offset=offset,
            reason=reason,
            consumer_group=self.settings.build_group_id,
            payload=(value or b"").decode("utf-8", errors="replace"),
        )
        await self.broker.publish(
            letter.model_dump_json().encode(),
            topic=dead_letter_topic(topic),
            headers={
                "content-type": "application/json",
                "x-original-topic": topic,
                "x-original-partition": str(partition),
                "x-original-offset": str(offset),
            },
        )
        log.warning("dead-lettered %s[%d]@%d: %s", topic, partition, offset, reason)
        self.metrics.requests.labels(outcome="dead_letter").inc()
        self.metrics.dead_letters.labels(topic=topic).inc()
