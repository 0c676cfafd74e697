"""Knowledge end to end: an upload through the real broker to ready chunks in pgvector, and the
knowledge source reading them (issue 8)."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from broker.topics import upload_topics
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.encoding import Encoder
from contextcore.sources.knowledge import KnowledgeContextSource
from contextcore.storage.tenancy import TenantDatabase
from producers.client import ContextClient
from producers.knowledge import KnowledgeClient, UploadFailed, UploadSuperseded
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject
from tests.documents import bomb_pdf, corrupt_pdf, encrypted_pdf, text_pdf
from tests.integration.helpers import only_encoder, producer, read_json
from tests.services import Config, StartConsumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),  # an embedding consumer loads its model first: slow on a busy machine
]

ORG_A = uuid.UUID("6f1c2a3b-0000-4000-8000-00000000000a")
ORG_B = uuid.UUID("6f1c2a3b-0000-4000-8000-00000000000b")

HANDBOOK = """# Handbook

## Pricing

The Team plan costs 20 euros per seat and month, billed yearly. The Enterprise plan is quoted
per contract and includes single sign-on.

## Refunds

A customer may cancel within 30 days of purchase and receive a full refund. After 30 days no
refund is given, but the subscription runs until the end of the paid period.

## Support hours

Support answers on weekdays from 8:00 to 18:00 Central European Time.
"""


def upload(
    correlation_id: str,
    reply_to: str,
    *,
    organization: uuid.UUID | None = ORG_A,
    key: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "schema_version": 1,
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization" if organization else "platform",
        "organization_id": str(organization) if organization else None,
        "title": "Handbook",
        "media_type": "text/markdown",
        "idempotency_key": key or f"key-{correlation_id}",
        "uri": "docs://handbook",
        "content": {"text": HANDBOOK},
    }
    message.update(fields)
    return message


async def publish(config: Config, *messages: dict[str, Any]) -> None:
    client = await producer(config.bootstrap)
    try:
        for message in messages:
            await client.send_and_wait(config.topics.upload, json.dumps(message).encode())
    finally:
        await client.stop()


async def statuses(
    config: Config, reply_to: str, count: int, timeout: float = 90.0
) -> list[dict[str, Any]]:
    return await read_json(config.bootstrap, reply_to, until=count, timeout=timeout)


@pytest.fixture
async def organizations(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )


@pytest.fixture
async def pipeline(config: Config, start_consumer: StartConsumer, organizations: None) -> Config:
    from broker.topics import ensure_topics

    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    return config


def knowledge_request(organization: uuid.UUID, query: str) -> ContextRequest:
    return ContextRequest(
        subject=ContextSubject(
            organization_id=organization, user_id=None, definition_id=None, trigger_id=None
        ),
        query=query,
        entities=(),
    )


def spec(**options: Any) -> ContextSourceSpec:
    return ContextSourceSpec(name="knowledge", token_budget=1_500, limit=8, options=options)


async def test_an_upload_becomes_ready_and_the_knowledge_source_finds_it(
    pipeline: Config, tenant_db: TenantDatabase, encoder: Encoder
) -> None:
    reply_to = pipeline.reply_topic("upload-ready")
    await publish(pipeline, upload("c-1", reply_to))
    replies = await statuses(pipeline, reply_to, 2)
    assert [r["status"] for r in replies] == ["pending", "ready"]
    assert {r["correlation_id"] for r in replies} == {"c-1"}
    ready = replies[1]
    assert ready["chunks"] == 3  # one per section: each fits the window
    source = KnowledgeContextSource(tenant_db, QueryVectors(only_encoder(encoder)))
    items = await source.retrieve(
        knowledge_request(ORG_A, "can I get my money back after cancelling?"),
        spec(include_organization=True),
    )
    assert items, "a ready source is searched"
    assert items[0].title == "Handbook > Refunds"
    assert "full refund" in items[0].body
    assert items[0].ref is not None
    assert items[0].ref.kind == "knowledge_chunk"


@pytest.fixture
async def client(pipeline: Config) -> AsyncIterator[KnowledgeClient]:
    async with pipeline.knowledge_client() as knowledge:
        yield knowledge


@pytest.mark.parametrize(
    ("data", "media_type", "reason"),
    [
        (corrupt_pdf(), "application/pdf", "the PDF cannot be read"),
        (encrypted_pdf(), "application/pdf", "the PDF is encrypted"),
        (bomb_pdf(), "application/pdf", "Limit reached while decompressing"),
        (b"\x89PNG\r\n\x1a\n", "image/png", "'image/png' is not readable"),
        (b" \n\n \t", "text/plain", "the document has no text"),
    ],
)
async def test_a_document_that_cannot_be_read_fails_its_source_and_the_consumer_goes_on(
    client: KnowledgeClient,
    admin: asyncpg.Connection,
    data: bytes,
    media_type: str,
    reason: str,
) -> None:
    with pytest.raises(UploadFailed) as failed:
        await client.upload(
            organization_id=ORG_A,
            title="bad",
            media_type=media_type,
            uri="docs://bad",
            content=data,
            timeout=60,
        )
    assert failed.value.status.status == "failed"
    assert reason in (failed.value.status.reason or "")
    stored = await admin.fetchrow(
        "SELECT status, status_reason FROM knowledge_sources WHERE uri = 'docs://bad'"
    )
    assert stored is not None
    assert stored["status"] == "failed"
    assert reason in stored["status_reason"]
    ready = await client.upload(
        organization_id=ORG_A,
        title="Good",
        media_type="application/pdf",
        uri="docs://good",
        content=text_pdf("Refunds are paid within 30 days.", "Support answers on weekdays."),
        timeout=60,
    )
    assert ready.status == "ready"
    assert ready.chunks == 2


async def test_the_same_upload_twice_is_ingested_once(
    pipeline: Config, admin: asyncpg.Connection
) -> None:
    reply_to = pipeline.reply_topic("twice")
    message = upload("c-twice", reply_to, key="the-key")
    await publish(pipeline, message)
    first = await statuses(pipeline, reply_to, 2)
    assert [r["status"] for r in first] == ["pending", "ready"]
    await publish(pipeline, message)
    again = (await statuses(pipeline, reply_to, 3))[2]
    assert again["status"] == "ready"
    assert again["source_id"] == first[1]["source_id"]
    assert again["generation"] == 1
    rows = await admin.fetch("SELECT generation FROM knowledge_chunks")
    assert [r["generation"] for r in rows] == [1, 1, 1]


async def test_a_new_upload_of_the_same_identity_replaces_the_chunks(
    client: KnowledgeClient, admin: asyncpg.Connection
) -> None:
    first = await client.upload(
        organization_id=ORG_A,
        title="Handbook",
        media_type="text/markdown",
        uri="docs://handbook",
        content=HANDBOOK,
    )
    second = await client.upload(
        organization_id=ORG_A,
        title="Handbook",
        media_type="text/markdown",
        uri="docs://handbook",
        content="# Handbook\n\n## Refunds\n\nNo refunds after 14 days.\n",
    )
    assert second.source_id == first.source_id
    assert (first.generation, second.generation) == (1, 2)
    assert second.chunks == 1
    rows = await admin.fetch("SELECT generation, text FROM knowledge_chunks")
    assert [(r["generation"], r["text"]) for r in rows] == [(2, "No refunds after 14 days.")]


async def test_an_upload_replaced_while_pending_is_told_superseded_and_the_later_one_ends_ready(
    config: Config, start_consumer: StartConsumer, organizations: None, admin: asyncpg.Connection
) -> None:
    """Issue 17, item 5: two uploads of one document; the second starts the next generation
    before the first is ready and takes the source's reply address. The first uploader hears
    ``superseded`` (final) instead of waiting for ever, and so does a redelivery of its record;
    the embedding group never answers the replaced generation."""
    from broker.topics import ensure_topics

    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await start_consumer(config, consumer="upload")  # no embedding group yet: nothing gets ready
    later_reply, again_reply = config.reply_topic("later"), config.reply_topic("again")
    async with config.knowledge_client() as client:
        first = asyncio.create_task(
            client.upload(
                organization_id=ORG_A,
                title="Handbook",
                media_type="text/markdown",
                uri="docs://handbook",
                content=HANDBOOK,
                idempotency_key="k-first",
                timeout=60,
            )
        )
        async with asyncio.timeout(60):
            while True:  # generation 1 is chunked and waits for its vectors
                chunked = await admin.fetchval(
                    "SELECT count(*) FROM knowledge_source_models WHERE generation = 1"
                )
                if chunked:
                    break
                await asyncio.sleep(0.05)
        await publish(config, upload("c-later", later_reply, key="k-later"))
        with pytest.raises(UploadSuperseded) as superseded:
            await first
    status = superseded.value.status
    assert (status.status, status.generation) == ("superseded", 1)
    assert status.reason is not None
    assert "a later upload or retry of the same document replaced this one" in status.reason
    assert "(generation 2)" in status.reason
    await publish(config, upload("c-again", again_reply, key="k-first"))  # a redelivery of it
    [again] = await statuses(config, again_reply, 1)
    assert (again["status"], again["source_id"]) == ("superseded", str(status.source_id))
    await start_consumer(config, consumer="embed")  # generation 1's batches are stale by now
    later = await statuses(config, later_reply, 2)
    # either order: the batches go out before the pending reply, and the embedding group may
    # answer first on a busy host (docs/topics.md)
    assert sorted((r["status"], r["generation"]) for r in later) == [("pending", 2), ("ready", 2)]
    assert [r["status"] for r in await statuses(config, again_reply, 1)] == ["superseded"]
    rows = await admin.fetch("SELECT DISTINCT generation FROM knowledge_chunks")
    assert [r["generation"] for r in rows] == [2]


async def test_a_consumer_killed_mid_document_leaves_no_duplicate_and_the_document_ends_ready(
    config: Config, start_consumer: StartConsumer, organizations: None, admin: asyncpg.Connection
) -> None:
    from broker.topics import ensure_topics

    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    config = config.with_("upload", embed_batch_chunks=4)
    await start_consumer(config, consumer="upload")
    embedder = await start_consumer(config, consumer="embed")
    sections = "\n\n".join(
        f"## Topic {i}\n\nParagraph {i} explains rule number {i} of the long handbook."
        for i in range(120)
    )
    reply_to = config.reply_topic("killed")
    await publish(config, upload("c-kill", reply_to, content={"text": f"# Long\n\n{sections}"}))
    async with asyncio.timeout(60):
        while True:  # some batches stored, not all
            stored = await admin.fetchval(
                "SELECT coalesce(sum(chunks_stored), 0) FROM knowledge_source_models"
            )
            if stored >= 8:
                break
            await asyncio.sleep(0.05)
    await embedder.stop(signal.SIGKILL)
    partial = await admin.fetchrow("SELECT chunks_stored, chunk_count FROM knowledge_source_models")
    assert partial is not None
    assert partial["chunks_stored"] < partial["chunk_count"] == 120
    await start_consumer(config, consumer="embed")
    replies = await statuses(config, reply_to, 2)
    assert replies[-1]["status"] == "ready"
    assert replies[-1]["chunks"] == 120
    counts = await admin.fetchrow(
        "SELECT count(*) AS chunks, count(DISTINCT ordinal) AS ordinals FROM knowledge_chunks"
    )
    assert counts is not None
    assert (counts["chunks"], counts["ordinals"]) == (120, 120)


async def test_a_brief_cites_the_chunks_of_the_tenant_and_of_the_platform_only(
    pipeline: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """The build consumer embeds the query itself (the light OpenVINO encoder), and the brief
    holds A's chunk and the platform's, never B's."""
    await start_consumer(pipeline.with_("build", preload_encoder=True))
    async with pipeline.knowledge_client() as client:
        for organization, text in [
            (ORG_A, "# A\n\n## Refunds\n\nA refunds within 30 days of purchase."),
            (ORG_B, "# B\n\n## Refunds\n\nB refunds within 90 days of purchase."),
            (None, "# Platform\n\n## Refunds\n\nThe platform explains what a refund is."),
        ]:
            await client.upload(
                organization_id=organization,
                title="Policy",
                media_type="text/markdown",
                uri="docs://policy",
                content=text,
            )
    policy = ContextPolicy(
        total_token_budget=1_500,
        sources=[
            ContextSourceSpec(
                name="knowledge",
                token_budget=1_500,
                limit=8,
                options={"include_platform": True, "include_organization": True},
            )
        ],
    )
    async with ContextClient.from_settings(pipeline.kafka, pipeline.topics) as builds:
        brief = await builds.build(
            knowledge_request(ORG_A, "how long do I have to ask for a refund?"), policy, timeout=60
        )
    assert "A refunds within 30 days" in brief.text
    assert "The platform explains" in brief.text
    assert "B refunds" not in brief.text
    cited = {ref.id for ref in brief.items if ref.kind == "knowledge_chunk"}
    owners = await admin.fetch(
        "SELECT DISTINCT organization_id FROM knowledge_chunks WHERE id = ANY($1::bigint[])",
        [int(i) for i in cited],
    )
    assert {r["organization_id"] for r in owners} == {ORG_A, None}
