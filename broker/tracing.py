"""W3C trace context in Kafka headers (``traceparent``, ``tracestate``): what a record carries
from its producer to its consumer, and on the reply back.

Through OpenTelemetry's API when it is installed (the service depends on it; the client takes it
with its extra ``tracing``); without it, or with no span current, every function here gives
nothing, and a record carries no trace header. Only the trace context travels: baggage, which
may hold anything a caller put there, is neither sent nor read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

try:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the client without its extra "tracing"
    _PROPAGATOR = None
else:
    _PROPAGATOR = TraceContextTextMapPropagator()

if TYPE_CHECKING:
    from opentelemetry.context import Context

TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
MAX_TRACE_HEADER = 512
"""A longer value is no trace context (W3C: traceparent is 55 characters, tracestate 512)."""


def trace_headers() -> list[tuple[str, bytes]]:
    """The current span's context as Kafka headers; none without a current span."""
    if _PROPAGATOR is None:
        return []
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [(name, value.encode("ascii")) for name, value in carrier.items()]


def context_of(headers: Iterable[tuple[str, bytes]]) -> Context | None:
    """The trace context a record's headers carry (an empty one when they carry none, or a
    malformed one: a hostile header starts a new trace, never an error); ``None`` without
    OpenTelemetry."""
    if _PROPAGATOR is None:
        return None
    carrier: dict[str, str] = {}
    for name, value in headers:
        if name in TRACE_HEADERS and len(value) <= MAX_TRACE_HEADER:
            try:
                carrier[name] = value.decode("ascii")
            except (UnicodeDecodeError, AttributeError):
                continue
    return _PROPAGATOR.extract(carrier)
