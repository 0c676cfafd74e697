"""One trace per request: the span a consumer opens for each record, and where spans go.

A record's span continues the trace its ``traceparent`` header names (broker/tracing.py) and is
current while the handler runs and the outcome is published: the builder's source reads and its
packer are its children, the reply carries its context back, and so do the batches an upload
hands to the embedding group (one trace from an upload to its last batch). A retried copy keeps
the client's header, so each attempt is a child of the caller's span. Without a current
``traceparent`` a record starts a trace of its own.

Spans are exported over OTLP (http/protobuf) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, with
the standard ``OTEL_*`` settings. Otherwise no tracer provider is set and no span is made at
all (contextcore/tracing.py: 2.8 µs per build, docs/performance.md), though a caller's context
is still passed on. ``CONTEXTCORE_TRACE_SQL=true`` adds a span per asyncpg statement (off by
default: a build sends several).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind

from broker.tracing import context_of
from consumers.runtime.records import Inbound
from contextcore.tracing import NO_SPAN, recording

_tracer = trace.get_tracer("contextcore.consumer")


def consuming(record: Inbound, group: str) -> AbstractContextManager[Span]:
    """The span of one record's handling and its outcome's publishing, as the current span.

    While nothing records spans, no span is made (at no cost); a record that carries a caller's
    trace context still passes it on: it is current meanwhile, so the reply, the batches it
    hands on and its log lines name the caller's trace."""
    if recording():
        return _recorded(record, group)
    if any(name == "traceparent" for name, _ in record.headers):
        return _passed_on(record)
    return NO_SPAN


@contextmanager
def _passed_on(record: Inbound) -> Iterator[Span]:
    token = otel_context.attach(context_of(record.headers) or otel_context.Context())
    try:
        yield INVALID_SPAN
    finally:
        otel_context.detach(token)


@contextmanager
def _recorded(record: Inbound, group: str) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        f"{record.topic} process",
        context=context_of(record.headers),
        kind=SpanKind.CONSUMER,
        record_exception=False,  # the runtime turns every error into an outcome itself
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": "kafka",
                    "messaging.operation.type": "process",
                    "messaging.destination.name": record.topic,
                    "messaging.destination.partition.id": str(record.partition),
                    "messaging.kafka.offset": record.offset,
                    "messaging.consumer.group.name": group,
                    "contextcore.attempt": record.attempt,
                }
            )
        yield span


class Exporting:
    """What :func:`export_from_environment` set up, to flush on the way out."""

    def __init__(self, provider: object | None) -> None:
        self._provider = provider

    def shutdown(self) -> None:
        """Export the spans still buffered (a stopping consumer's last records)."""
        shutdown = getattr(self._provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def export_from_environment(service: str) -> Exporting:
    """Export this process's spans over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the
    service name ``contextcore-<service>`` unless ``OTEL_SERVICE_NAME`` says otherwise); set
    nothing up otherwise. ``CONTEXTCORE_TRACE_SQL=true`` also traces asyncpg's statements."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return Exporting(None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"contextcore-{service}"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    if os.environ.get("CONTEXTCORE_TRACE_SQL", "").lower() in ("1", "true", "yes"):
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        AsyncPGInstrumentor().instrument()  # type: ignore[no-untyped-call]
    return Exporting(provider)
