"""Documents the upload consumer accepted but could never store (issue 32, item 2), through the
real upload and embedding consumers: each ends in a final status at its first handling, never
in four extractions, a dead letter and a source pending until the sweep.

* A word of 100,000 characters, a heading path of 5,000 and 1.9 MB of 150-character words (one
  unknown word piece each) are cut into chunks bounded in characters, in batches bounded in
  bytes: they become ``ready``.
* A document whose passage cannot be a record even alone (a broker limit set to its least)
  fails at once, with a reason a person understands.
* An upload for an organization that does not exist is ``rejected`` ("no such organization"),
  with no database text in the answer and nothing stored.
* An address its unique index cannot hold (2,000 CJK characters: 6,000 bytes) is ``rejected`` by
  the schema, in UTF-8 bytes; and whatever else the database refuses to open for good is
  ``rejected`` at once by the store, never retried into a dead letter.
* A batch the database refuses for good fails its source at once, and its uploader hears why.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from pathlib import Path

import asyncpg
import pytest

from broker.topics import TopicSpec, dead_letter_topic, ensure_topics, upload_topics
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.knowledge.adapters.store import PostgresKnowledgeRepository
from contextcore.knowledge.chunk import ChunkSettings
from contextcore.knowledge.ingest import NewSource, UploadRefused
from contextcore.storage.tenancy import TenantDatabase
from producers.knowledge import UploadFailed
from schemas.upload import EmbedBatchV1, EmbedChunkV1
from tests.integration.helpers import Librdkafka, assigned_reader, producer, read_json
from tests.integration.test_knowledge_pipeline import ORG_A, upload
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

MAX_CHARS = ChunkSettings().max_chars


async def dead_letters(config: Config) -> int:
    """The records on the upload topic's dead-letter topic now (each answered upload's letter
    would have been written before its answer)."""
    consumer = await assigned_reader(config.bootstrap, dead_letter_topic(config.topics.upload))
    try:
        count = 0
        for _ in range(5):  # a few empty fetches: the topic is read to its end
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                count += len(batch)
        return count
    finally:
        await consumer.stop()


async def chunk_bounds(admin: asyncpg.Connection, title: str) -> tuple[int, int, int]:
    row = await admin.fetchrow(
        "SELECT count(*), max(length(c.text)), max(length(c.section)) FROM knowledge_chunks c "
        "JOIN knowledge_sources s ON s.id = c.source_id WHERE s.title = $1",
        title,
    )
    assert row is not None
    return row[0], row[1], row[2]


@pytest.mark.timeout(600)
async def test_documents_that_could_not_be_stored_become_ready(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    uploads = tmp_path / "uploads"
    root = uploads / str(ORG_A)
    root.mkdir(parents=True)
    words = " ".join(f"{i:06d}" + "w" * 144 for i in range(12_600))  # 1.9 MB, 150 each
    (root / "words.txt").write_text(words)
    assert len(words.encode()) > 1_900_000
    config = config.with_("upload", file_root=uploads)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    async with config.knowledge_client() as client:
        word = await client.upload(
            organization_id=ORG_A,
            title="Word",
            media_type="text/plain",
            uri="docs://word",
            content="before " + "!" * 100_001 + " after",
        )
        heading = await client.upload(
            organization_id=ORG_A,
            title="Heading",
            media_type="text/markdown",
            uri="docs://heading",
            content="# " + "heading " * 625 + "\n\nThe passage under a long heading.",
        )
        many = await client.upload(
            organization_id=ORG_A,
            title="Words",
            media_type="text/plain",
            object=(root / "words.txt").as_uri(),
        )
    assert (word.status, heading.status, many.status) == ("ready", "ready", "ready")
    for title in ("Word", "Heading", "Words"):
        count, longest, longest_section = await chunk_bounds(admin, title)
        assert count >= 1
        assert longest <= MAX_CHARS, title
        assert longest_section <= 1_000, title
    assert (await chunk_bounds(admin, "Words"))[0] > 100  # many batches, none over a record
    assert await dead_letters(config) == 0


@pytest.mark.timeout(300)
async def test_a_passage_that_cannot_be_a_record_fails_its_source_at_once(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """With the broker's record limit at its least (10,000 bytes), a passage of 2,048 four-byte
    characters under a heading of as many cannot be a record even alone."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    config = config.with_("kafka", max_record_bytes=10_000)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    async with config.knowledge_client() as client:
        with pytest.raises(UploadFailed) as failed:
            await client.upload(
                organization_id=ORG_A,
                title="Faces",
                media_type="text/markdown",
                uri="docs://faces",
                content="# " + "\U0001f600" * 900 + "\n\n" + "\U0001f600" * 3_000,
            )
        fine = await client.upload(
            organization_id=ORG_A,
            title="Fine",
            media_type="text/plain",
            uri="docs://fine",
            content="A short passage fits a small record.",
        )
    status = failed.value.status
    assert status.status == "failed"
    assert status.reason is not None
    assert "cannot be stored" in status.reason
    assert "10,000-byte limit" in status.reason
    assert fine.status == "ready"
    source = await admin.fetchrow(
        "SELECT status, status_reason FROM knowledge_sources WHERE title = 'Faces'"
    )
    assert source is not None
    assert source["status"] == "failed"
    assert await dead_letters(config) == 0


@pytest.mark.timeout(300)
async def test_an_upload_for_no_organization_is_rejected_at_once(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    nobody = uuid.uuid4()
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await start_consumer(config, consumer="upload")
    async with config.knowledge_client() as client:
        with pytest.raises(UploadFailed) as failed:
            await client.upload(
                organization_id=nobody,
                title="Orphan",
                media_type="text/plain",
                uri="docs://orphan",
                content="Nobody owns this.",
            )
    status = failed.value.status
    assert status.status == "rejected"
    assert status.reason == f"no such organization: {nobody}"
    assert not status.details
    assert await admin.fetchval("SELECT count(*) FROM knowledge_sources") == 0
    assert await dead_letters(config) == 0


WIDE_URI = "docs://" + "".join(chr(0x4E00 + i * 7_919 % 20_000) for i in range(1_993))
"""2,000 characters, 5,986 bytes in UTF-8, none repeated often (an index compresses a row that
repeats one character under its limit)."""


@pytest.mark.timeout(300)
async def test_an_address_its_index_cannot_hold_is_rejected_at_once(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """2,000 CJK characters passed a bound in characters, and PostgreSQL's unique index refused
    them (a row over 2,704 bytes) four times: a dead letter ``gave_up`` and a ``handler_error``
    answer (issue 32). The bound is in bytes now."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await start_consumer(config, consumer="upload")
    reply_to = config.reply_topic("wide")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    try:
        for name, uri in (("wide", WIDE_URI), ("object", "s3://b/" + WIDE_URI[7:])):
            message = upload(name, reply_to, key=name, title=name, media_type="text/plain")
            if name == "wide":
                message |= {"uri": uri, "content": {"text": "wide"}}
            else:  # an object is its own identity: no uri, no content
                del message["uri"], message["content"]
                message["object"] = uri
            await asyncio.to_thread(
                client.send, config.topics.upload, json.dumps(message).encode(), name.encode()
            )
        replies = [await asyncio.to_thread(client.reply, n, 120.0) for n in ("wide", "object")]
    finally:
        await asyncio.to_thread(client.close)
    for reply in replies:
        assert reply["status"] == "rejected", reply
        assert "bytes in UTF-8, over 2,000" in json.dumps(reply), reply
    assert await admin.fetchval("SELECT count(*) FROM knowledge_sources") == 0
    assert await dead_letters(config) == 0


async def test_what_the_database_refuses_to_open_is_refused_for_good(
    admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Past the schema (a caller of the store, a bound that drifts from the index): the store
    answers ``UploadRefused``, which the upload consumer answers ``rejected`` at once, not a
    database error it would retry four times."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    repository = PostgresKnowledgeRepository(tenant_db)
    new = NewSource(
        kind="inline",
        title="Wide",
        uri=WIDE_URI,  # within the table's CHECK (2,000 characters), over the index's row
        object_key=None,
        media_type="text/plain",
        reply_to=None,
        correlation_id=None,
    )
    with pytest.raises(UploadRefused) as refused:
        await repository.open_upload(ORG_A, "wide", new)
    assert str(refused.value) == "the database refuses this upload (a value it cannot hold)"
    assert isinstance(refused.value.__cause__, asyncpg.ProgramLimitExceededError)
    assert await admin.fetchval("SELECT count(*) FROM knowledge_sources") == 0
    assert await admin.fetchval("SELECT count(*) FROM processed_messages") == 0
    opened = await repository.open_upload(ORG_A, "wide", replace(new, uri="docs://narrow"))
    assert opened.claimed  # the refused call's key was not spent


@pytest.mark.timeout(300)
async def test_a_batch_the_database_refuses_fails_its_source_at_once(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """A batch whose passage PostgreSQL cannot hold (a NUL byte) is not retried into a dead
    letter while its source waits an hour for the sweep: the source fails, its uploader hears
    why."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    source = uuid.uuid4()
    reply_to = config.reply_topic("refused")
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, pending_since, upload_key, reply_to, correlation_id) VALUES ($1, $2,"
        " 'inline', 'Nul', 'docs://nul', 'text/plain', 'pending', now(), 'k', $3, 'c-nul')",
        source,
        ORG_A,
        reply_to,
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, status, pending_since) VALUES ($1, $2, $3, 1, 2,"
        " 'pending', now())",
        ORG_A,
        source,
        DEFAULT_MODEL,
    )
    await ensure_topics(config.bootstrap, [*upload_topics(config.topics), TopicSpec(reply_to, 1)])
    batch = EmbedBatchV1(
        organization_id=ORG_A,
        source_id=source,
        generation=1,
        embedding_model=DEFAULT_MODEL,
        chunks=[EmbedChunkV1(ordinal=0, section="s", text="before \x00 after", tokens=5)],
    )
    send = await producer(config.bootstrap)
    try:
        await send.send_and_wait(config.topics.embed, batch.model_dump_json().encode(), key=b"k")
    finally:
        await send.stop()
    await start_consumer(config, consumer="embed")
    (status,) = await read_json(config.bootstrap, reply_to, until=1, timeout=120)
    assert status["correlation_id"] == "c-nul"
    assert status["status"] == "failed"
    assert status["reason"] == (
        "the document cannot be stored: the database refused one of its passages "
        "(text it cannot hold)"
    )
    row = await admin.fetchrow("SELECT status FROM knowledge_sources WHERE id = $1", source)
    assert row is not None
    assert row["status"] == "failed"
