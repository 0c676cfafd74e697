"""Documents an admin can list and delete (issue 18), on the real broker and PostgreSQL: uploaded
through the upload topic to running consumers, listed and deleted through ``DocumentsClient``
and ``contextcore knowledge``, searched by the knowledge source."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from admin.documents import DocumentsClient
from contextcore.knowledge.adapters import store
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.encoding import Encoder
from contextcore.sources.knowledge import KnowledgeContextSource
from contextcore.storage.tenancy import TenantDatabase
from schemas.upload import EmbedBatchV1, EmbedChunkV1
from tests.integration.helpers import only_encoder, producer, read_json
from tests.integration.test_knowledge_admin import command, start_pipeline, upload_all
from tests.integration.test_knowledge_pipeline import (
    HANDBOOK,
    ORG_A,
    ORG_B,
    knowledge_request,
    spec,
)
from tests.services import Config, StartConsumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),  # an embedding consumer loads its model first: slow on a busy machine
]

FAQ = """# FAQ

## Invoices

Invoices are sent by email on the first working day of each month.
"""


@pytest.fixture
async def running(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> Config:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )
    await start_pipeline(config, start_consumer)
    return config


async def test_a_deleted_document_leaves_search_at_once_and_may_be_uploaded_again(
    running: Config, admin: asyncpg.Connection, tenant_db: TenantDatabase, encoder: Encoder
) -> None:
    handbook, _, theirs = await upload_all(
        running,
        (ORG_A, "docs://handbook", HANDBOOK),
        (ORG_A, "docs://faq", FAQ),
        (ORG_B, "docs://handbook", HANDBOOK),
    )
    documents = DocumentsClient(tenant_db)
    listed = await documents.documents(ORG_A)
    assert [(d.title, d.status, d.chunks, d.model) for d in listed] == [
        ("FAQ", "ready", 1, DEFAULT_MODEL),
        ("Handbook", "ready", 3, DEFAULT_MODEL),
    ]
    assert listed[1].size_bytes == len(HANDBOOK.encode())
    assert listed[1].identity == "docs://handbook"
    assert listed[1].uploaded_at <= listed[0].uploaded_at
    assert [d.title for d in await documents.documents(ORG_A, limit=1)] == ["FAQ"]
    after = (listed[0].uploaded_at, listed[0].id)
    assert [d.title for d in await documents.documents(ORG_A, after=after)] == ["Handbook"]

    source = KnowledgeContextSource(tenant_db, QueryVectors(only_encoder(encoder)))
    refund = knowledge_request(ORG_A, "can I get my money back after cancelling?")
    own = spec(include_organization=True)
    assert "full refund" in (await source.retrieve(refund, own))[0].body

    # B's client reaches none of A's documents
    assert [d.id for d in await documents.documents(ORG_B)] == [theirs.source_id]
    assert await documents.delete(ORG_B, listed[0].id) is None
    assert await documents.delete(ORG_B, identity="docs://faq") is None

    gone = await documents.delete(ORG_A, identity="docs://handbook", requested_by="ops@a.example")
    assert gone is not None
    assert (gone.source_id, gone.chunks, gone.requested_by) == (
        handbook.source_id,
        3,
        "ops@a.example",
    )
    assert gone.login == await admin.fetchval(
        "SELECT usename FROM pg_user WHERE usename = $1", gone.login
    )
    assert not gone.login.startswith("postgres"), "the runtime login deleted it"
    items = await source.retrieve(refund, own)
    assert all("full refund" not in item.body for item in items), "gone from search at once"
    left = await admin.fetchrow(
        "SELECT (SELECT count(*) FROM knowledge_chunks WHERE source_id = $1) AS chunks,"
        " (SELECT count(*) FROM knowledge_source_models WHERE source_id = $1) AS states",
        handbook.source_id,
    )
    assert left is not None
    assert (left["chunks"], left["states"]) == (0, 0)
    assert (
        await admin.fetchval(
            "SELECT count(*) FROM knowledge_chunks WHERE source_id = $1", theirs.source_id
        )
        == 3
    ), "B's copy of the same uri is untouched"
    [record] = await documents.deletions(ORG_A)
    assert (record.title, record.identity, record.chunks) == ("Handbook", "docs://handbook", 3)
    assert await documents.deletions(ORG_B) == []
    assert await documents.delete(ORG_A, handbook.source_id) is None, "deleted once"

    [again] = await upload_all(running, (ORG_A, "docs://handbook", HANDBOOK))
    assert again.status == "ready"
    assert again.source_id != handbook.source_id
    assert "full refund" in (await source.retrieve(refund, own))[0].body


async def test_the_admin_command_lists_and_deletes_within_its_scope(running: Config) -> None:
    await upload_all(running, (ORG_A, "docs://faq", FAQ))
    a = ("--organization", str(ORG_A))
    code, out = await command(running, "documents", *a)
    assert code == 0, out
    assert "ready" in out
    assert "FAQ  [docs://faq]" in out
    code, out = await command(
        running, "delete", "--uri", "docs://faq", "--organization", str(ORG_B)
    )
    assert (code, "no document" in out) == (1, True), out
    code, out = await command(running, "delete", "--uri", "docs://faq", *a)
    assert (code, "dry run" in out) == (0, True), out
    code, out = await command(
        running, "delete", "--uri", "docs://faq", *a, "--by", "ops", "--apply"
    )
    assert (code, "deleted FAQ and its 1 chunk(s)" in out) == (0, True), out
    code, out = await command(running, "documents", *a, "--deleted")
    assert (code, "for ops  1 chunk(s)  FAQ  [docs://faq]" in out) == (0, True), out
    code, out = await command(running, "documents", *a)
    assert (code, "0 document(s)" in out) == (0, True), out


async def test_an_upload_deleted_after_its_batches_were_sent_is_told(
    running: Config, admin: asyncpg.Connection, tenant_db: TenantDatabase
) -> None:
    """Issue 18, migration 00023: the upload consumer is done once the batches are on the embed
    topic; the document is deleted before they are stored. The first batch that finds its
    source gone (here one of an older generation) answers the uploader failed, on its reply
    topic, with its correlation id and the generation deleted; later ones store nothing and
    say nothing; a ready document's deletion keeps no reply address (nobody waits on it)."""
    reply_topic = running.reply_topic("deleted")
    source = uuid.uuid4()
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, pending_since, upload_key, reply_to, correlation_id, generation) VALUES ($1,"
        " $2, 'inline', 'Handbook', 'docs://pending', 'text/plain', 'pending', now(), 'k', $3,"
        " 'upload-1', 2)",
        source,
        ORG_A,
        reply_topic,
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status, pending_since)"
        " VALUES ($1, $2, $3, 2, 1, 0, 'pending', now())",
        ORG_A,
        source,
        DEFAULT_MODEL,
    )
    assert await DocumentsClient(tenant_db).delete(ORG_A, source) is not None
    batch = EmbedBatchV1(
        organization_id=ORG_A,
        source_id=source,
        generation=1,
        embedding_model=DEFAULT_MODEL,
        chunks=[EmbedChunkV1(ordinal=0, section="Handbook", text="Refunds take a week.", tokens=6)],
    )
    send = await producer(running.bootstrap)
    try:
        await send.send_and_wait(running.topics.embed, batch.model_dump_json().encode())
    finally:
        await send.stop()
    [told] = await read_json(running.bootstrap, reply_topic, until=1)
    assert (told["correlation_id"], told["status"], told["reason"], told["generation"]) == (
        "upload-1",
        "failed",
        "the document was deleted",
        2,
    )
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks") == 0
    for organization in (ORG_A, ORG_B):  # told once; a batch forged in B's name learns nothing
        async with tenant_db.writing(organization) as tenant:
            later = await store.store_batch(tenant, source, DEFAULT_MODEL, 2, [], [])
        assert (later.stale, later.deleted) == (True, None)

    [ready] = await upload_all(running, (ORG_A, "docs://faq", FAQ))
    await DocumentsClient(tenant_db).delete(ORG_A, ready.source_id)
    kept = await admin.fetchrow(
        "SELECT reply_to, correlation_id FROM knowledge_deletions WHERE source_id = $1",
        ready.source_id,
    )
    assert kept is not None
    assert (kept["reply_to"], kept["correlation_id"]) == (None, None)
