"""One build request, one outcome.

1. Decode (``schemas.wire``) and validate. A record whose ``reply_to`` the reply-topic rule
   refuses is dead-lettered (``reply_to_refused``), never answered. A record that fails gets an
   ``invalid_request`` error reply when its ``reply_to`` and ``correlation_id`` can be read;
   otherwise it is dead-lettered with the reason.
2. Admit the policy (``policy_rejected``); answer ``reuse_previous`` for a resume the policy
   does not refresh; build. A required source failure is ``required_source_failed``; any
   other exception of the builder is ``internal_error``. Every one of these is a reply.

Before all that, on the record's receipt, :meth:`BuildHandler.screen` admits the organization:
over its quota build_rate the request is answered ``throttled``, with how long to wait
(contextcore/quotas.py, contextcore/throttle.py), without a slot, so a flood it refuses never
queues in front of another organization's requests.

The handler does no Kafka I/O: it returns the reply and the runtime publishes it, with a small
``internal_error`` reply as the fallback when the brief itself cannot be sent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any
from uuid import UUID

from broker.reply_topics import ReplyTopics
from consumers.build.metrics import BuildMetrics
from consumers.build.read_after import Readers
from consumers.runtime.decoding import decode_request
from consumers.runtime.logs import bind_correlation_id
from consumers.runtime.records import DeadLetter, Inbound, Outcome, Reply, Stopwatch
from contextcore.builder import ContextBuilder
from contextcore.quotas import QuotaReader
from contextcore.registry import ContextSourceRegistry
from contextcore.throttle import BoundedLabels, OrganizationRate
from schemas import wire
from schemas.build import BuildReplyV1, BuildRequestV1, ErrorInfo, parse_build_request
from schemas.envelope import printable, reply_address
from schemas.errors import PolicyError, RequiredContextSourceError
from schemas.wire import WireError

log = logging.getLogger("contextcore.build")

ENTITIES = ("request", "entities")
"""Read leniently: a malformed ref (a lone surrogate included) is dropped, not the request."""


MAX_DETAILS = 50
"""An error reply names at most this many problems (and how many more there were)."""


def _internal_error(correlation_id: str) -> Callable[[str], BuildReplyV1]:
    """The small reply that goes instead when the real one cannot be sent."""

    def fallback(reason: str) -> BuildReplyV1:
        info = ErrorInfo(code="internal_error", message=reason[:2_000])
        return BuildReplyV1.failed(correlation_id, info)

    return fallback


def _refuse(
    topic: str, correlation_id: str, message: str, details: list[str], _data: object
) -> Reply:
    info = ErrorInfo(code="invalid_request", message=message, details=details)
    return _error_reply((topic, correlation_id), info)


def _error_reply(address: tuple[str, str], info: ErrorInfo) -> Reply:
    topic, correlation_id = address
    if len(info.details) > MAX_DETAILS:
        hidden = len(info.details) - MAX_DETAILS
        info = info.model_copy(
            update={"details": [*info.details[:MAX_DETAILS], f"… and {hidden} more"]}
        )
    return Reply(
        topic,
        correlation_id,
        BuildReplyV1.failed(correlation_id, info),
        fallback=_internal_error(correlation_id),
    )


def _organization_of(data: Any) -> UUID | None:
    """The organization a decoded request names, or ``None`` when it names none readable."""
    try:
        return UUID(data["request"]["subject"]["organization_id"])
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


class BuildHandler:
    def __init__(
        self,
        registry: ContextSourceRegistry,
        builder: ContextBuilder | Readers,
        metrics: BuildMetrics,
        *,
        reply_topics: ReplyTopics,
        quotas: QuotaReader | None = None,
    ) -> None:
        """``builder`` builds every request; ``Readers`` when a request that names a position
        may need another (read-your-writes, read_after.py)."""
        self.registry = registry
        self.readers = (
            builder if isinstance(builder, Readers) else Readers(read=builder, metrics=metrics)
        )
        self.metrics = metrics
        self.reply_topics = reply_topics
        self.quotas = quotas
        self.rate = OrganizationRate()
        self._throttled_label = BoundedLabels()

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        with watch.stage("decode"):
            decoded = self.decode(record.value)
        if not isinstance(decoded, tuple):
            self._count(decoded)
            return decoded
        envelope, dropped = decoded
        bind_correlation_id(envelope.correlation_id)  # this record's log lines name it
        with watch.stage("build"):
            reply = await self.answer(envelope, dropped)
        self.metrics.requests.labels(outcome=reply.status).inc()
        return Reply(
            envelope.reply_to,
            envelope.correlation_id,
            reply,
            fallback=_internal_error(envelope.correlation_id),
        )

    def decode(self, value: bytes | None) -> tuple[BuildRequestV1, int] | Reply | DeadLetter:
        """The request and its count of dropped entities, or what to answer instead."""
        return decode_request(
            value,
            parse_build_request,
            "build request",
            _refuse,
            reply_topics=self.reply_topics,
            lenient=(ENTITIES,),
        )

    async def answer(self, envelope: BuildRequestV1, dropped: int) -> BuildReplyV1:
        """Admission, the resume rule, then the build; every outcome is a reply."""
        correlation_id = envelope.correlation_id
        try:
            self.registry.validate_policy(envelope.policy)  # admission at the message boundary
        except PolicyError as error:
            return BuildReplyV1.failed(
                correlation_id,
                ErrorInfo(
                    code="policy_rejected",
                    message="the context policy fails admission",
                    details=[printable(str(error))],
                ),
            )
        if envelope.resumed_after_wait and not envelope.policy.refresh_on_resume:
            return BuildReplyV1(correlation_id=correlation_id, status="reuse_previous")
        manifest = None
        try:
            builder = await self.readers.builder(envelope.read_after)
            if envelope.explain:
                brief, manifest = await builder.build_explained(envelope.request, envelope.policy)
            else:
                brief = await builder.build(envelope.request, envelope.policy)
        except RequiredContextSourceError as error:
            return BuildReplyV1.failed(
                correlation_id,
                ErrorInfo(
                    code="required_source_failed",
                    message=printable(str(error)),
                    details=[
                        printable(f"{s}: {r}")
                        for s, r in zip(error.sources, error.reasons, strict=True)
                    ],
                ),
            )
        except Exception as error:  # a bug in a builder must not stall the partition
            log.exception("build failed for correlation id %s", correlation_id)
            return BuildReplyV1.failed(  # the class, never the text: the log has that
                correlation_id,
                ErrorInfo(
                    code="internal_error",
                    message=f"the build failed ({type(error).__name__}); the service's log "
                    "has the detail under this correlation id",
                ),
            )
        self.metrics.brief(brief)
        return BuildReplyV1.ok(correlation_id, brief, dropped_entities=dropped, manifest=manifest)

    async def screen(self, record: Inbound) -> Reply | None:
        """The ``throttled`` reply to a request whose organization is over its quota
        build_rate; ``None`` to admit it, or for a record it cannot read (the handler answers
        that one). A JSON decode, a cached quota and a token bucket: a flood costs no build."""
        if self.quotas is None or record.attempt > 1:  # a retried copy was admitted once
            return None
        try:
            data = wire.decode(record.value, lenient=(ENTITIES,))
        except WireError:
            return None
        address = reply_address(data)
        organization = _organization_of(data)
        if address is None or organization is None:
            return None
        throttled = await self._throttle(organization, address[1])
        if throttled is None:
            return None
        self.metrics.requests.labels(outcome=throttled.status).inc()
        return Reply(*address, throttled, fallback=_internal_error(address[1]))

    async def _throttle(self, organization: UUID, correlation_id: str) -> BuildReplyV1 | None:
        """The ``throttled`` reply when the organization is over its quota build_rate; ``None``
        when it is admitted (or has no such quota; the quotas are read once per organization
        per few seconds)."""
        assert self.quotas is not None
        quotas = await self.quotas.quotas(organization)
        rate = quotas.build_rate
        if rate is None:
            return None
        burst = quotas.build_burst or max(1.0, rate)
        wait_s = self.rate.admit(organization, rate, burst)
        if not wait_s:
            return None
        self.metrics.throttled.labels(self._throttled_label(organization)).inc()
        wait_ms = max(1, math.ceil(wait_s * 1000))
        return BuildReplyV1.failed(
            correlation_id,
            ErrorInfo(
                code="throttled",
                message=f"the organization is over its quota build_rate ({rate:g} builds a "
                f"second, build_burst {burst:g}); try again in {wait_ms} ms",
                retry_after_ms=wait_ms,
            ),
        )

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """An ``internal_error`` reply for a request the runtime gave up on."""
        address = wire.address_of(record.value)
        if address is None:
            return None
        message = printable(f"the request was not handled: {reason}")[:2_000]
        return _error_reply(address, ErrorInfo(code="internal_error", message=message))

    def _count(self, outcome: Reply | DeadLetter) -> None:
        self.metrics.requests.labels(
            outcome="error" if isinstance(outcome, Reply) else "dead_letter"
        ).inc()
