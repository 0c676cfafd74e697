"""Whether this process records spans, and a span that costs nothing when it does not.

OpenTelemetry's API makes non-recording spans when no SDK is installed, but each still costs a
context switch: about 3 µs a span, some 20 µs for the seven spans of a build (measured in
docs/performance.md). Until a tracer provider is set (the consumers set one when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is; tests set one to read spans), :func:`span` hands out the
invalid span instead, for a fraction of a microsecond.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span


def recording() -> bool:
    """Whether a tracer provider was set for this process (else spans go nowhere). Reads the
    API's global as ``trace.set_tracer_provider`` leaves it: ``get_tracer_provider()`` would
    also read the environment on every call."""
    return getattr(trace, "_TRACER_PROVIDER", None) is not None


class _NoSpan(AbstractContextManager[Span]):
    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


NO_SPAN = _NoSpan()
"""A context manager of the invalid span: nothing recorded, nothing made current."""


def span(tracer: trace.Tracer, name: str, **options: Any) -> AbstractContextManager[Span]:
    """``tracer.start_as_current_span(name, **options)`` when spans are recorded; the invalid
    (non-recording) span, at no cost, when they are not."""
    if not recording():
        return NO_SPAN
    return tracer.start_as_current_span(name, **options)
