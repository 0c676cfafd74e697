"""One trace per request, through the real broker and PostgreSQL (issue 22): the consumers run in
this process so the SDK's in-memory exporter reads their spans (tests/spans.py). A build continues
the caller's trace (its record's span is the caller's child; each source read and the packer
are the record's children) and its reply carries the trace back; an upload is one trace from
the upload to its last embedding batch."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from broker.tracing import trace_headers
from consumers.build.app import create_app as build_app
from consumers.knowledge.embed.app import create_app as embed_app
from consumers.knowledge.upload.app import create_app as upload_app
from consumers.runtime.app import ConsumerApp
from devstack import demo_seed
from schemas.build import BuildRequestV1
from schemas.context import ContextPolicy, ContextRequest, ContextSubject, ResourceRef
from schemas.upload import InlineContent, UploadRequestV1
from tests.integration.helpers import producer, read_records, request_message, until_true
from tests.services import Config, ConsumerProcess, StartConsumer
from tests.spans import by_name, collected, parent_id, span_id, trace_id, tree

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SOURCES = ("conversation", "application", "dossier", "definition_summary", "run_history")


@asynccontextmanager
async def serving(*apps: ConsumerApp) -> AsyncIterator[None]:
    """The apps in this process, ready; drained and stopped at the end."""
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(app.serve(stopping)) for app in apps]
    try:
        async with asyncio.timeout(240):
            while not all(app.ready() for app in apps):
                for task in tasks:
                    if task.done():
                        task.result()
                await asyncio.sleep(0.05)
        yield
    finally:
        stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def replies_with_headers(
    config: Config, topic: str, until: int
) -> list[tuple[bytes, dict[str, bytes]]]:
    records = await read_records(config.bootstrap, topic, until=until, timeout=120)
    return [(r.value or b"", dict(r.headers or ())) for r in records]


def traceparent(trace: int, span: int) -> bytes:
    return f"00-{trace:032x}-{span:016x}-01".encode()


def ids_of(header: bytes) -> tuple[int, int]:
    """The trace id and the parent span id a ``traceparent`` names."""
    _, trace, span, _ = header.decode().split("-")
    return int(trace, 16), int(span, 16)


async def test_a_build_is_one_trace_from_the_callers_span_to_the_reply(
    config: Config, admin: asyncpg.Connection
) -> None:
    await demo_seed.seed_demo(admin)
    app = build_app(config.build, config.kafka, config.topics, config.database, config.knowledge)
    replies = config.reply_topic("traced")
    request = BuildRequestV1(
        correlation_id="traced",
        reply_to=replies,
        request=ContextRequest(
            subject=ContextSubject(
                organization_id=demo_seed.ORGANIZATION,
                user_id=demo_seed.USER,
                trigger_id=None,
                definition_id=None,
            ),
            query="What should I know before I call Ada?",
            entities=(ResourceRef(kind="crm.company", id=str(demo_seed.ACME)),),
            conversation_id=demo_seed.CONVERSATION,
        ),
        policy=ContextPolicy.model_validate(
            {
                "total_token_budget": 1000,
                "sources": [{"name": name, "token_budget": 200} for name in SOURCES],
            }
        ),
    )
    with collected() as exported:
        async with serving(app):
            with trace.get_tracer("test").start_as_current_span("caller") as caller:
                headers = trace_headers()
            send = await producer(config.bootstrap)
            try:
                await send.send_and_wait(
                    config.request_topic, request.model_dump_json().encode(), headers=headers
                )
            finally:
                await send.stop()
            [(_, reply_headers)] = await replies_with_headers(config, replies, until=1)
        spans = exported.get_finished_spans()
    print(f"\n{tree(spans)}")

    [record] = by_name(spans, f"{config.request_topic} process")
    assert trace_id(record) == caller.get_span_context().trace_id
    assert parent_id(record) == caller.get_span_context().span_id
    assert record.attributes is not None
    assert record.attributes["contextcore.outcome"] == "reply"
    for name in SOURCES:
        [read] = by_name(spans, f"source {name}")
        assert (trace_id(read), parent_id(read)) == (trace_id(record), span_id(record)), name
        assert read.attributes is not None
        assert read.attributes["contextcore.outcome"] == "ok"
    [pack] = by_name(spans, "pack")
    assert parent_id(pack) == span_id(record)
    assert ids_of(reply_headers["traceparent"]) == (trace_id(record), span_id(record))


async def test_an_upload_is_one_trace_from_the_upload_to_its_last_embedding_batch(
    config: Config, admin: asyncpg.Connection
) -> None:
    organization = uuid.uuid4()
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'T')", organization)
    upload = config.with_("upload", embed_batch_chunks=1)  # a batch per chunk: several batches
    apps = (
        upload_app(upload.upload, config.kafka, config.topics, config.database, config.knowledge),
        embed_app(config.embed, config.kafka, config.topics, config.database, config.knowledge),
    )
    replies = config.reply_topic("traced-upload")
    text = "# Refunds\n\n" + "\n\n".join(
        f"Paragraph {n}: refunds are paid within thirty days of a request. " * 12 for n in range(4)
    )
    message = UploadRequestV1(
        correlation_id="traced-upload",
        reply_to=replies,
        scope="organization",
        organization_id=organization,
        title="Refunds",
        media_type="text/markdown",
        idempotency_key="traced-upload",
        uri="docs://traced",
        content=InlineContent(text=text),
    )
    with collected() as exported:
        async with serving(*apps):
            with trace.get_tracer("test").start_as_current_span("caller") as caller:
                headers = trace_headers()
            send = await producer(config.bootstrap)
            try:
                await send.send_and_wait(
                    config.topics.upload, message.model_dump_json().encode(), headers=headers
                )
            finally:
                await send.stop()
            answers = await replies_with_headers(config, replies, until=2)  # pending, ready
        spans = exported.get_finished_spans()
    print(f"\n{tree(spans)}")

    assert [b'"ready"' in value for value, _ in answers] == [False, True]
    [uploaded] = by_name(spans, f"{config.topics.upload} process")
    assert trace_id(uploaded) == caller.get_span_context().trace_id
    assert parent_id(uploaded) == caller.get_span_context().span_id
    batches = by_name(spans, f"{config.topics.embed} process")
    assert len(batches) > 1
    for batch in batches:
        assert (trace_id(batch), parent_id(batch)) == (trace_id(uploaded), span_id(uploaded))
    for _, reply_headers in answers:  # pending from the upload's span, ready from a batch's
        assert f"{trace_id(uploaded):032x}".encode() in reply_headers["traceparent"]


async def test_a_consumers_log_lines_about_a_record_are_json_with_its_ids(
    config: Config, start_consumer: StartConsumer
) -> None:
    """A consumer whose stderr is a file logs JSON lines; one about a record names the record,
    its correlation id and its trace (the caller's)."""
    consumer = await start_consumer(config.with_("build", source_timeout_s=1e-6))
    replies = config.reply_topic("logged")
    message = request_message(
        "logged-1",
        replies,
        policy={
            "total_token_budget": 100,
            "sources": [{"name": "dossier", "token_budget": 50, "required": True}],
        },
    )
    caller_trace = uuid.uuid4().int >> 64 << 64 | 1  # any valid trace id
    headers = [("traceparent", traceparent(caller_trace, 0x1234))]
    send = await producer(config.bootstrap)
    try:
        value = json.dumps(message).encode()
        await send.send_and_wait(config.request_topic, value, headers=headers)
    finally:
        await send.stop()
    [(_, reply_headers)] = await replies_with_headers(config, replies, until=1)
    assert f"{caller_trace:032x}".encode() in reply_headers["traceparent"]

    async def logged() -> bool:  # written before the reply, flushed soon after
        return "dossier failed" in consumer.log()

    await until_true(logged, timeout=60)
    lines = [json.loads(line) for line in consumer.log().splitlines() if line.startswith("{")]
    [failed] = [line for line in lines if "dossier failed" in line["message"]]
    assert failed["level"] == "WARNING"
    assert failed["correlation_id"] == "logged-1"
    assert failed["trace_id"] == f"{caller_trace:032x}"
    assert failed["record"].startswith(f"{config.request_topic}/")


class Collector:
    """An OTLP/HTTP receiver on 127.0.0.1: what a consumer exports, decoded (the protobuf the
    SDK's exporter posts to ``/v1/traces``)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, bytes, bytes]] = []  # (name, trace id, parent span id)
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        received.extend((s.name, s.trace_id, s.parent_span_id) for s in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_a_consumer_exports_its_spans_over_otlp_when_an_endpoint_is_set(
    config: Config, tmp_path: Path
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT set: a ``contextcore serve build`` process posts its spans,
    asyncpg's statements among them with CONTEXTCORE_TRACE_SQL; they continue the caller's
    trace, and the process's service name is contextcore-build."""
    collector = Collector()
    env = {
        **config.environ(),
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within 0.1 s, not 5 s
        "CONTEXTCORE_TRACE_SQL": "true",
    }
    log = (tmp_path / "consumer.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumers.cli", "serve", "build",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=log,
    )  # fmt: skip
    consumer = ConsumerProcess(process, tmp_path / "consumer.log")
    try:
        await consumer.wait_ready()
        replies = config.reply_topic("exported")
        message = request_message(
            "exported-1",
            replies,
            policy={
                "total_token_budget": 100,
                "sources": [{"name": "run_history", "token_budget": 50}],
            },
        )
        message["request"]["subject"]["user_id"] = "6f1c2a3b-0000-4000-8000-0000000000aa"
        caller_trace = uuid.uuid4().int >> 64 << 64 | 1
        send = await producer(config.bootstrap)
        try:
            await send.send_and_wait(
                config.request_topic,
                json.dumps(message).encode(),
                headers=[("traceparent", traceparent(caller_trace, 0x1234))],
            )
        finally:
            await send.stop()
        await replies_with_headers(config, replies, until=1)

        async def exported() -> bool:
            names = {name for name, _, _ in collector.spans}
            return {"source run_history", "pack"} <= names

        await until_true(exported, timeout=60)
    finally:
        await consumer.stop()
        log.close()
        collector.close()
    mine = [s for s in collector.spans if s[1] == caller_trace.to_bytes(16, "big")]
    names = {name for name, _, _ in mine}
    assert f"{config.request_topic} process" in names
    assert {"source run_history", "pack"} <= names
    [record] = [s for s in mine if s[0] == f"{config.request_topic} process"]
    assert record[2] == (0x1234).to_bytes(8, "big")  # the caller's span is its parent
    assert len(names - {f"{config.request_topic} process", "source run_history", "pack"}) > 0, (
        "asyncpg's statements are spans too with CONTEXTCORE_TRACE_SQL"
    )
