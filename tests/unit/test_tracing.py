"""Trace context in Kafka headers (broker/tracing.py), the builder's spans (contextcore/builder.py)
and the log lines' fields (consumers/runtime/logs.py), read with the SDK's in-memory exporter."""

from __future__ import annotations

import io
import json
import logging
import uuid

import pytest
from opentelemetry import trace

from broker.tracing import context_of, trace_headers
from consumers.runtime import logs
from consumers.runtime import tracing as runtime_tracing
from consumers.runtime.records import Inbound
from contextcore.builder import DefaultContextBuilder
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from schemas.context import ContextPolicy, ContextRequest, ContextSubject
from tests.spans import by_name, collected, parent_id, span_id, trace_id
from tests.unit.fakes import StaticSource, item

REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
    ),
    query="q",
    entities=(),
)


def test_the_current_span_travels_in_headers_and_comes_back_as_the_parent() -> None:
    tracer = trace.get_tracer("test")
    with collected() as spans:
        assert trace_headers() == []  # no current span: no header
        with tracer.start_as_current_span("caller") as caller:
            headers = trace_headers()
        with tracer.start_as_current_span("consumer", context=context_of(headers)):
            pass
    [traceparent] = [value for name, value in headers if name == "traceparent"]
    assert f"{caller.get_span_context().trace_id:032x}".encode() in traceparent
    [consumer] = by_name(spans.get_finished_spans(), "consumer")
    assert parent_id(consumer) == caller.get_span_context().span_id


def test_a_malformed_or_foreign_header_starts_a_new_trace_never_an_error() -> None:
    tracer = trace.get_tracer("test")
    hostile = [
        ("traceparent", b"\xff\xfe not ascii"),
        ("traceparent", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01"),  # the invalid all-zero id
        ("tracestate", b"x" * 10_000),
        ("baggage", b"tenant=other"),
    ]
    with collected() as spans:
        for header in hostile:
            with tracer.start_as_current_span("consumer", context=context_of([header])):
                pass
    assert all(span.parent is None for span in spans.get_finished_spans())


async def test_each_source_read_and_the_packer_are_spans_of_the_build() -> None:
    sources = [
        StaticSource("app", [item("app")]),
        StaticSource("broken", error=RuntimeError("db down")),
        StaticSource("slow", delay=5),
    ]
    policy = ContextPolicy.model_validate(
        {
            "total_token_budget": 100,
            "sources": [
                {"name": "app", "token_budget": 50},
                {"name": "broken", "token_budget": 50, "required": False},
                {"name": "slow", "token_budget": 50, "required": False},
            ],
        }
    )
    builder = DefaultContextBuilder(
        ContextSourceRegistry(sources), ContextPacker(), source_timeout_s=0.05
    )
    with collected() as exported:
        with trace.get_tracer("test").start_as_current_span("record"):
            await builder.build(REQUEST, policy)
        spans = exported.get_finished_spans()
    [record] = by_name(spans, "record")
    outcomes = {}
    for name in ("app", "broken", "slow"):
        [read] = by_name(spans, f"source {name}")
        assert (trace_id(read), parent_id(read)) == (trace_id(record), span_id(record))
        assert read.attributes is not None
        outcomes[name] = read.attributes["contextcore.outcome"]
    assert outcomes == {"app": "ok", "broken": "error", "slow": "timeout"}
    [pack] = by_name(spans, "pack")
    assert parent_id(pack) == span_id(record)


def test_a_log_line_about_a_record_carries_its_correlation_id_and_trace_id_as_json() -> None:
    stream = io.StringIO()  # not a terminal: JSON lines
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.RecordFields())
    handler.setFormatter(logs.JsonLines())
    logger = logging.getLogger("test.logs")
    logger.addHandler(handler)
    try:
        with collected(), trace.get_tracer("test").start_as_current_span("record") as span:
            logs.about_record("topic/0/7")
            logs.bind_correlation_id("c-1")
            logger.warning("something about the record: %s", "detail")
        logs.about_record(None)
        logger.warning("nothing about a record")
    finally:
        logger.removeHandler(handler)
    about, other = (json.loads(line) for line in stream.getvalue().splitlines())
    assert about["message"] == "something about the record: detail"
    assert (about["record"], about["correlation_id"]) == ("topic/0/7", "c-1")
    assert about["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert about["level"] == "WARNING"
    assert "correlation_id" not in other
    assert "trace_id" not in other


def test_while_nothing_records_a_callers_trace_context_is_passed_on_and_nothing_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime_tracing, "recording", lambda: False)
    caller = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced = Inbound("t", 0, 1, None, b"{}", (("traceparent", caller),))
    with runtime_tracing.consuming(traced, "g") as span:
        assert not span.is_recording()
        assert trace_headers() == [("traceparent", caller)]  # the reply names the caller's
    plain = Inbound("t", 0, 2, None, b"{}", ())
    with runtime_tracing.consuming(plain, "g") as span:
        assert not span.is_recording()
        assert trace_headers() == []
