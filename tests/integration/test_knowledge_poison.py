"""Fuzzing the upload and embedding topics through the real broker and real consumer processes,
sent by a librdkafka client (issue 8): every record is settled, the consumer never dies, and the
valid record queued behind a poisoned one on the same partition is still handled.

Upload records are fuzzed at the message (bytes, huge numbers, deep nesting, lone surrogates,
NUL bytes, oversize records, wrong types, bad reply addresses, reply topics the reply-topic rule
refuses, which must get nothing, hostile object addresses under a root that holds a named pipe
and a link out) and at the document: random bytes declared as PDF, HTML, Markdown or text, which
must fail their source, not the consumer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.topics import dead_letter_topic, ensure_topics, upload_topics
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from tests.integration.helpers import (
    Librdkafka,
    free_port,
    read_json,
    replies_among,
    settled,
    status_mb,
    until_true,
)
from tests.integration.test_poison_records import (
    foreign_reply_topics,
    json_values,
    named_reply_topics,
    text_of,
)
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

ORG = uuid.UUID("6f1c2a3b-0000-4000-8000-0000000000f1")
UNSETTLED = {"gave_up", "retry_refused"}
"""Dead-letter causes of a record that failed in a way worth retrying: none may occur."""


def upload(correlation_id: str, reply_to: str) -> dict[str, Any]:
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(ORG),
        "title": "Notes",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://{correlation_id}",
        "content": {"text": "# Notes\n\nRefunds within 30 days."},
    }


TARGETS = [
    ("correlation_id",),
    ("scope",),
    ("organization_id",),
    ("title",),
    ("media_type",),
    ("idempotency_key",),
    ("uri",),
    ("content",),
    ("content", "text"),
    ("action",),
]


@st.composite
def poison_upload(
    draw: st.DrawFn,
    reply_to: str,
    correlation_id: str,
    foreign: st.SearchStrategy[str],
    file_root: str = "/srv/uploads",
) -> bytes:
    kind = draw(
        st.sampled_from(
            [
                "bytes",
                "oversize",
                "value",
                "huge",
                "deep",
                "surrogate",
                "nul",
                "address",
                "foreign_address",
                "document",
                "object",
            ]
        )
    )
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=2_000))
    if kind == "oversize":
        return draw(st.sampled_from([b"{", b"[", b"\xff"])) * draw(st.integers(300_000, 990_000))
    message = upload(correlation_id, reply_to)
    if kind == "address":
        message["reply_to"] = draw(st.sampled_from(["", ".", "x" * 300, "\ud800", 7, None]))
        return json.dumps(message).encode()
    if kind == "foreign_address":  # an upload, a retry, valid or not: never answered there
        message["reply_to"] = draw(foreign)
        if draw(st.booleans()):
            message = {
                "action": "reingest",
                "scope": "organization",
                "organization_id": str(ORG),
                "source_id": str(uuid.uuid4()),
                "idempotency_key": message["idempotency_key"],
                "correlation_id": correlation_id,
                "reply_to": message["reply_to"],
            }
        if draw(st.booleans()):
            message["title"] = draw(json_values)
        return json.dumps(message).encode()
    if kind == "object":  # a hostile object address: every one ends in a status with a reason
        del message["uri"], message["content"]
        piece = st.sampled_from(
            ["/", "..", "%00", "%2e%2e", "%2f", "@", ":", "pipe", "guide.md", "?", "#", "\\", "%"]
        )
        tail = draw(st.lists(piece | st.text(max_size=6), max_size=12).map("".join))
        prefixes = ["s3://", "file://", "file:///", "s3://docs/", f"file://{file_root}/"]
        message["object"] = draw(st.sampled_from(prefixes)) + tail
        return json.dumps(message).encode()
    if kind == "document":
        message["media_type"] = draw(
            st.sampled_from(["application/pdf", "text/html", "text/markdown", "text/plain"])
        )
        data = draw(st.binary(max_size=4_000))
        if draw(st.booleans()):
            data = b"%PDF-1.4\n" + data
        message["content"] = {"base64": base64.b64encode(data).decode()}
        return json.dumps(message).encode()
    path = draw(st.sampled_from(TARGETS))
    parent = message
    for step in path[:-1]:
        parent = parent[step]
    raw: dict[str, str] = {}
    if kind == "value" and path == ("correlation_id",):
        parent[path[-1]] = draw(st.none() | st.integers() | st.lists(st.booleans(), max_size=2))
    elif kind == "value":
        parent[path[-1]] = draw(json_values)
    elif kind == "huge":
        parent[path[-1]] = "@raw@"
        raw["raw"] = "9" * draw(st.integers(19, 6_000))
    elif kind == "deep":
        depth = draw(st.integers(60, 2_000))
        parent[path[-1]] = "@raw@"
        raw["raw"] = "[" * depth + "1" + "]" * depth
    elif kind == "surrogate":
        parent[path[-1]] = "a\udbff"
    else:
        parent[path[-1]] = "\x00" * draw(st.integers(1, 3))
    return text_of(message, **raw)


@pytest.mark.timeout(600)
async def test_fuzzed_uploads_never_stall_a_partition_and_each_one_is_settled(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'F')", ORG)
    uploads = tmp_path / "uploads"
    root = uploads / str(ORG)  # the organization's folder of the upload root
    root.mkdir(parents=True)
    os.mkfifo(root / "pipe")
    (root / "guide.md").write_text("# Guide\n\nRead me.")
    os.symlink("/etc/passwd", root / "passwd")
    config = config.with_(
        "upload",
        file_root=uploads,
        s3_buckets=("docs",),
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",  # a store that never answers
        retry_backoff_s=0.05,
    )
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    consumer = await start_consumer(config, consumer="upload")
    reply_to = config.reply_topic("upload-fuzz")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    sent: dict[str, tuple[int, int]] = {}
    foreign = foreign_reply_topics(config.topics)
    named: set[str] = set()  # the other reply topics the records named
    run = uuid.uuid4().hex[:8]  # __consumer_offsets is the broker's: ids no other run sends

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        correlation_id = f"fuzz-{run}-{len(sent)}"
        value = data.draw(poison_upload(reply_to, correlation_id, foreign, str(root)))
        named.update(named_reply_topics(value, reply_to))
        key = data.draw(st.sampled_from([b"a", b"b"]))
        sent[correlation_id] = client.send(config.topics.upload, value, key)
        after = f"after-{correlation_id}"
        valid = json.dumps(upload(after, reply_to)).encode()
        client.send(config.topics.upload, valid, key)
        assert client.reply(after)["status"] in {"pending", "ready"}

    try:
        await asyncio.to_thread(fuzz)
        answered, letters = await settled(
            client, config.bootstrap, dead_letter_topic(config.topics.upload), sent
        )
    finally:
        await asyncio.to_thread(client.close)
    assert consumer.process.returncode is None
    assert not {letter["cause"] for letter in letters} & UNSETTLED
    for cid in answered:  # a document that cannot be read fails its source, with the reason
        reply = client.replies[cid]  # its last status (a later upload of its URI supersedes it)
        assert reply["status"] in {"pending", "ready", "failed", "rejected", "superseded"}
        if reply["status"] in {"failed", "rejected", "superseded"}:
            assert reply["reason"]
    assert named  # the fuzzer did name other reply topics (about one record in ten)
    assert await replies_among(config.bootstrap, named, sent) == []  # none outside the rule
    assert "Traceback" not in consumer.log()


EMBED_MEMORY_MB = 1_536
"""The embedding consumer's documented memory (k8s/embed-consumer.yaml's limit)."""


@st.composite
def memory_batch(draw: st.DrawFn, source: str) -> dict[str, Any]:
    """A batch aimed at the encoder's memory: many chunks of long texts of one-piece
    characters, within the wire's bounds or past them (the reviewer's was 64 chunks of
    100,000 ``!``: 6.4 MB, 1.7 GB of tokenizer state)."""
    count = draw(st.integers(1, 512))
    length = draw(st.integers(1, 120_000))
    letter = draw(st.sampled_from(["!", "\u4e00", "a", "x "]))
    text = (letter * length)[:length] or "!"
    chunks = [
        {"ordinal": i, "section": "s" * draw(st.sampled_from([1, 4_000])), "text": text,
         "tokens": 3}
        for i in range(count)
    ]  # fmt: skip
    return {
        "organization_id": str(ORG),
        "source_id": source,
        "generation": 1,
        "embedding_model": DEFAULT_MODEL,
        "chunks": chunks,
    }


@st.composite
def poison_batch(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "value", "stale", "deep", "huge", "surrogate", "memory"]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=2_000))
    if kind == "memory":  # for a source that does not exist: encoded, then nothing stored
        aimed = draw(memory_batch(str(uuid.uuid4())))
        value = json.dumps(aimed).encode()
        while len(value) > 8_000_000:  # what the test's client sends at most
            aimed["chunks"] = aimed["chunks"][: len(aimed["chunks"]) // 2]
            value = json.dumps(aimed).encode()
        return value
    batch: dict[str, Any] = {
        "organization_id": str(ORG),
        "source_id": str(uuid.uuid4()),
        "generation": 1,
        "embedding_model": DEFAULT_MODEL,
        "chunks": [{"ordinal": 0, "section": "s", "text": "t", "tokens": 3}],
    }
    if kind == "stale":  # well-formed, for a source that does not exist: nothing happens
        return json.dumps(batch).encode()
    field = draw(
        st.sampled_from(["organization_id", "source_id", "generation", "embedding_model", "chunks"])
    )
    if kind == "value":
        batch[field] = draw(json_values)
        return json.dumps(batch).encode()
    if kind == "surrogate":
        batch[field] = "\udc00"
        return json.dumps(batch).encode()
    batch[field] = "@raw@"
    depth = draw(st.integers(60, 2_000))
    raw = "9" * 5_000 if kind == "huge" else "[" * depth + "1" + "]" * depth
    return text_of(batch, raw=raw)


@pytest.mark.timeout(600)
async def test_fuzzed_embedding_batches_never_stall_a_partition(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'F')", ORG)
    source = await pending_source(admin, chunks=10_000)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    consumer = await start_consumer(config, consumer="embed")
    client = await asyncio.to_thread(
        Librdkafka, config.bootstrap, config.reply_topic("unused"), max_bytes=10_000_000
    )
    genuine = 0

    def stored() -> int:
        return int(
            asyncio.run_coroutine_threadsafe(
                admin.fetchval("SELECT chunks_stored FROM knowledge_source_models"), loop
            ).result(10)
        )

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        nonlocal genuine
        key = data.draw(st.sampled_from([b"a", b"b", b"c"]))
        client.send(config.topics.embed, data.draw(poison_batch()), key)
        batch = {
            "organization_id": str(ORG),
            "source_id": str(source),
            "generation": 1,
            "embedding_model": DEFAULT_MODEL,
            "chunks": [{"ordinal": genuine, "section": "s", "text": f"p {genuine}", "tokens": 4}],
        }
        client.send(config.topics.embed, json.dumps(batch).encode(), key)
        genuine += 1
        deadline = time.monotonic() + 180  # a batch of 512 long texts takes a while to encode
        while stored() < genuine:  # the genuine batch behind the poisoned one was stored
            assert time.monotonic() < deadline, "the partition stalled"
            time.sleep(0.02)

    loop = asyncio.get_running_loop()
    try:
        await asyncio.to_thread(fuzz)
    finally:
        await asyncio.to_thread(client.close)
    assert consumer.process.returncode is None
    assert await admin.fetchval("SELECT chunks_stored FROM knowledge_source_models") == genuine
    assert "Traceback" not in consumer.log()
    peak = status_mb(consumer.process.pid, "VmHWM")
    assert peak < EMBED_MEMORY_MB, f"the embedding consumer peaked at {peak:.0f} MB"


@pytest.mark.timeout(600)
async def test_batches_aimed_at_the_encoders_memory_keep_it_under_its_limit(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """The reviewer's batch, 64 chunks of 100,000 ``!`` (6.4 MB), took the embedding consumer
    past 1,536 MB three times: it is not read now (larger than any producer of ours sends), nor
    is one of 9 such chunks (over the wire's bounds); the largest batch the wire still takes
    aimed at the same memory
    (15 chunks of 65,536 ``!``, under 1,000,000 characters), and 512 chunks of the longest text
    a chunk of ours holds, are encoded within it. A genuine batch behind them is stored."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'F')", ORG)
    source = await pending_source(admin, chunks=1)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    consumer = await start_consumer(config, consumer="embed")
    client = await asyncio.to_thread(
        Librdkafka, config.bootstrap, config.reply_topic("unused"), max_bytes=10_000_000
    )

    def batch(source_id: uuid.UUID, count: int, text: str) -> bytes:
        chunks = [{"ordinal": i, "section": "s", "text": text, "tokens": 3} for i in range(count)]
        return json.dumps(
            {
                "organization_id": str(ORG),
                "source_id": str(source_id),
                "generation": 1,
                "embedding_model": DEFAULT_MODEL,
                "chunks": chunks,
            }
        ).encode()

    nowhere = uuid.uuid4()  # no such source: encoded, then nothing stored
    values = [
        batch(nowhere, 64, "!" * 100_000),  # over what a producer of ours sends: never read
        batch(nowhere, 9, "!" * 100_000),  # a record it reads, over the wire's bounds
        batch(nowhere, 15, "!" * 65_536),
        batch(nowhere, 512, "!" * 1_950),
        batch(source, 1, "a genuine passage"),
    ]
    try:
        for value in values:
            await asyncio.to_thread(client.send, config.topics.embed, value, b"k")
    finally:
        await asyncio.to_thread(client.close)

    async def stored() -> bool:
        return bool(await admin.fetchval("SELECT chunks_stored = 1 FROM knowledge_source_models"))

    await until_true(stored, timeout=300)
    letters = await read_json(config.bootstrap, dead_letter_topic(config.topics.embed), until=2)
    assert [letter["cause"] for letter in letters] == ["too_large", "invalid"]
    assert consumer.process.returncode is None
    peak = status_mb(consumer.process.pid, "VmHWM")
    print(f"the embedding consumer's peak: {peak:.0f} MB")
    assert peak < EMBED_MEMORY_MB, f"the embedding consumer peaked at {peak:.0f} MB"


async def pending_source(admin: asyncpg.Connection, *, chunks: int) -> uuid.UUID:
    """A source of ORG pending under the default model, expecting ``chunks`` chunks."""
    source = uuid.uuid4()
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, pending_since, upload_key) VALUES ($1, $2, 'inline', 'Long', $3,"
        " 'text/plain', 'pending', now(), 'k')",
        source,
        ORG,
        f"docs://{source}",
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, status, pending_since) VALUES ($1, $2, $3, 1, $4,"
        " 'pending', now())",
        ORG,
        source,
        DEFAULT_MODEL,
        chunks,
    )
    return source
