"""The spans this process finishes, for tests that read traces with the SDK's in-memory exporter.

OpenTelemetry takes one tracer provider per process, so the first test that asks installs it
(with a processor that keeps spans only while a test collects them); each test then collects
its own spans from a clean list.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_INSTALLED: list[TracerProvider] = []
_COLLECTING: list[bool] = [False]


class _WhileCollecting(SimpleSpanProcessor):
    """Exports only inside :func:`collected`: the other tests' spans are not kept."""

    def on_end(self, span: ReadableSpan) -> None:
        if _COLLECTING[0]:
            super().on_end(span)


@contextmanager
def collected() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter, emptied, receiving the spans this process finishes until the
    block ends (what it holds stays readable after it)."""
    if not _INSTALLED:
        provider = TracerProvider()
        provider.add_span_processor(_WhileCollecting(_EXPORTER))
        trace.set_tracer_provider(provider)
        _INSTALLED.append(provider)
    _EXPORTER.clear()
    _COLLECTING[0] = True
    try:
        yield _EXPORTER
    finally:
        _COLLECTING[0] = False


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else int(span.parent.span_id)


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def tree(spans: tuple[ReadableSpan, ...]) -> str:
    """The spans as an indented tree, children in the order they started (for a reader)."""
    ids = {span_id(span) for span in spans}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = parent_id(span)
        children.setdefault(parent if parent in ids else None, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            took = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
            outcome = (span.attributes or {}).get("contextcore.outcome")
            suffix = f"  [{outcome}]" if outcome is not None else ""
            lines.append(f"{'  ' * depth}{span.name}  {took:.1f} ms{suffix}")
            walk(span_id(span), depth + 1)

    walk(None, 0)
    return "\n".join(lines)
