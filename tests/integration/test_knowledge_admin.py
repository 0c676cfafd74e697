"""The admin commands as an operator runs them (``contextcore knowledge`` in its own process):
failed sources and their retry, and the model switch's four steps in order (issue 8)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import asyncpg
import pytest

from broker.topics import ensure_topics, upload_topics
from contextcore.knowledge.adapters import admin as admin_steps
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.settings import Encoders, ExtraModel
from contextcore.sources.knowledge import KnowledgeContextSource
from contextcore.storage.tenancy import PLATFORM, TenantDatabase
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.knowledge import KnowledgeClient, UploadFailed
from schemas.upload import UploadStatusV1
from tests.documents import corrupt_pdf
from tests.integration.test_knowledge_pipeline import (
    HANDBOOK,
    ORG_A,
    ORG_B,
    knowledge_request,
    spec,
)
from tests.services import Config, Database, StartConsumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),  # an embedding consumer loads its model first: slow on a busy machine
]

COPY = "test/minilm-copy"
"""The default model's files under a second name: a real second model for the switch."""


async def command(config: Config, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "admin.knowledge",
        *args,
        env=config.environ(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return await process.wait(), out.decode()


@pytest.fixture
async def running(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> Config:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )
    config = config.with_(
        "knowledge",
        extra_models=(ExtraModel(name=COPY, path=default_model_path(DEFAULT_MODEL)),),
    )
    await start_pipeline(config, start_consumer)
    return config


async def start_pipeline(config: Config, start_consumer: StartConsumer) -> None:
    """The upload topics, and an upload and an embedding consumer running on them."""
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )


async def client_for(config: Config) -> KnowledgeClient:
    client = KnowledgeClient(
        bootstrap_servers=config.bootstrap,
        upload_topic=config.topics.upload,
        reply_topic_prefix=config.topics.reply_prefix,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    )
    await client.start()
    return client


async def models_searched(database: Database, organization: uuid.UUID) -> set[Any]:
    conn = await asyncpg.connect(database.url)
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('role', 'contextcore_app', true),"
                " set_config('contextcore.organization_id', $1, true)",
                str(organization),
            )
            vector = await conn.fetchval(
                "SELECT embedding::text FROM knowledge_chunks WHERE organization_id = $1 LIMIT 1",
                organization,
            )
            rows = await conn.fetch(
                "SELECT embedding_model FROM knowledge_search($1, knowledge_active_model($1),"
                " $2::vector, 'refund', false, true, 10)",
                organization,
                vector,
            )
    finally:
        await conn.close()
    return {r["embedding_model"] for r in rows}


async def test_a_model_switch_runs_its_four_steps_in_order_and_never_mixes_models(
    running: Config, admin: asyncpg.Connection, database: Database
) -> None:
    client = await client_for(running)
    try:
        await client.upload(
            organization_id=ORG_A,
            title="Handbook",
            media_type="text/markdown",
            uri="docs://handbook",
            content=HANDBOOK,
        )
        await client.upload(  # B stays on the platform's model throughout
            organization_id=ORG_B,
            title="Handbook",
            media_type="text/markdown",
            uri="docs://handbook",
            content=HANDBOOK,
        )
    finally:
        await client.close()
    scope = ("--organization", str(ORG_A))
    code, out = await command(running, "switch", "flip", *scope, "--apply")
    assert (code, "no switch in progress" in out) == (1, True), out
    code, out = await command(running, "switch", "prepare", COPY, "--dimensions", "384", *scope)
    assert (code, "dry run" in out) == (0, True), out
    assert await admin.fetchval("SELECT count(*) FROM knowledge_settings") == 1, "dry run wrote"
    # registering the model writes the global catalog: the owner's to write (migration 00015)
    code, out = await command(
        running, "switch", "prepare", COPY, "--dimensions", "384", *scope, "--apply"
    )
    assert code == 2, out
    assert "CONTEXTCORE_DATABASE_OWNER_URL is not set" in out
    assert await admin.fetchval("SELECT count(*) FROM knowledge_models WHERE name = $1", COPY) == 0
    running = running.with_("database", owner_url=database.owner_url)
    code, out = await command(
        running, "switch", "prepare", COPY, "--dimensions", "384", *scope, "--apply"
    )
    assert code == 0, out
    assert await admin.fetchval("SELECT dimensions FROM knowledge_models WHERE name = $1", COPY)
    async with asyncio.timeout(90):
        while True:  # step 2: wait until every source is ready under the new model
            code, out = await command(running, "switch", "status", *scope)
            if code == 0:
                break
            assert await models_searched(database, ORG_A) == {DEFAULT_MODEL}, "old one serves"
            await asyncio.sleep(0.5)
    assert "1 of 1 ready" in out
    # the sweep failed the next model's row with its chunks stored (a dead embedder, say):
    # preparing again completes it from what is stored, instead of waiting for batches that
    # would insert nothing
    await admin.execute(
        "UPDATE knowledge_source_models SET status = 'failed', status_reason = 'swept',"
        " chunks_stored = 1, pending_since = NULL WHERE embedding_model = $1",
        COPY,
    )
    code, out = await command(running, "switch", "status", *scope)
    assert (code, "0 of 1 ready" in out) == (1, True), out
    code, out = await command(
        running, "switch", "prepare", COPY, "--dimensions", "384", *scope, "--apply"
    )
    assert code == 0, out
    await until_ready(running, *scope)
    assert await models_searched(database, ORG_A) == {DEFAULT_MODEL}, "not flipped yet"
    code, out = await command(running, "switch", "flip", *scope, "--apply")
    assert code == 0, out
    assert await models_searched(database, ORG_A) == {COPY}
    assert await models_searched(database, ORG_B) == {DEFAULT_MODEL}
    code, out = await command(running, "switch", "clean", *scope)
    assert f"{DEFAULT_MODEL}: 3 chunk(s)" in out, out
    code, out = await command(running, "switch", "clean", *scope, "--apply")
    assert (code, "deleted 3 chunk(s)" in out) == (0, True), out
    per_model = await admin.fetch(
        "SELECT organization_id, embedding_model, count(*) FROM knowledge_chunks"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    )
    assert [tuple(r) for r in per_model] == [(ORG_A, COPY, 3), (ORG_B, DEFAULT_MODEL, 3)]
    assert await models_searched(database, ORG_A) == {COPY}


async def test_a_failed_source_is_listed_with_its_reason_and_retried(
    running: Config, admin: asyncpg.Connection
) -> None:
    client = await client_for(running)
    try:
        ready = await client.upload(
            organization_id=ORG_A,
            title="Handbook",
            media_type="text/markdown",
            uri="docs://handbook",
            content=HANDBOOK,
        )
        with pytest.raises(UploadFailed):
            await client.upload(
                organization_id=ORG_A,
                title="Broken",
                media_type="application/pdf",
                uri="docs://broken",
                content=corrupt_pdf(),
            )
    finally:
        await client.close()
    await admin.execute(  # as the sweep leaves it: embedding died, the hour passed
        "UPDATE knowledge_sources SET status = 'failed', pending_since = NULL,"
        " status_reason = 'pending for more than an hour' WHERE id = $1",
        ready.source_id,
    )
    scope = ("--organization", str(ORG_A))
    code, out = await command(running, "failed", *scope)
    assert code == 0, out
    assert "pending for more than an hour" in out
    assert "the PDF cannot be read" in out
    assert "no stored text" in out
    broken = await admin.fetchval("SELECT id FROM knowledge_sources WHERE uri = 'docs://broken'")
    code, out = await command(running, "retry", str(broken), *scope, "--apply")
    assert (code, "no stored text" in out) == (1, True), out
    code, out = await command(running, "retry", str(ready.source_id), *scope)
    assert (code, "dry run" in out) == (0, True), out
    code, out = await command(running, "retry", str(ready.source_id), *scope, "--apply", "--wait")
    assert code == 0, out
    assert '"status": "ready"' in out
    row = await admin.fetchrow(
        "SELECT status, generation FROM knowledge_sources WHERE id = $1", ready.source_id
    )
    assert row is not None
    assert (row["status"], row["generation"]) == ("ready", 2)
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks WHERE generation = 2") == 3
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks WHERE generation = 1") == 0
    code, out = await command(running, "retry", str(ready.source_id), "--organization", str(ORG_B))
    assert (code, "no source" in out) == (1, True), "B cannot reach A's source"


PLATFORM_GUIDE = """# Platform guide

## Lifecycle

A company's lifecycle stage in the CRM moves from lead to customer when a deal is won.
"""


async def upload_all(
    config: Config, *documents: tuple[uuid.UUID | None, str, str], failed_too: bool = False
) -> list[UploadStatusV1]:
    """(organization or None for the platform, uri, markdown) each, one after the other, titled
    by its first heading; their final statuses: ready, or (``failed_too``) whatever ended it."""
    client = await client_for(config)
    statuses = []
    try:
        for organization, uri, text in documents:
            try:
                status = await client.upload(
                    organization_id=organization,
                    title=text.splitlines()[0].lstrip("# "),
                    media_type="text/markdown",
                    uri=uri,
                    content=text,
                )
            except UploadFailed as failed:
                if not failed_too:
                    raise
                status = failed.status
            statuses.append(status)
    finally:
        await client.close()
    return statuses


async def until_ready(config: Config, *scope: str) -> None:
    async with asyncio.timeout(90):
        while True:
            code, _ = await command(config, "switch", "status", *scope)
            if code == 0:
                return
            await asyncio.sleep(0.5)


async def not_ready_under(admin: asyncpg.Connection, organization: uuid.UUID, model: str) -> None:
    """As a slow embedder leaves it: the source's row under ``model`` not complete yet."""
    changed = await admin.execute(
        "UPDATE knowledge_source_models SET status = 'pending', chunks_stored = 0,"
        " pending_since = now() WHERE organization_id = $1 AND embedding_model = $2",
        organization,
        model,
    )
    assert changed != "UPDATE 0"


async def test_the_platform_flip_waits_for_every_organization_that_follows_it(
    running: Config, admin: asyncpg.Connection, database: Database, tenant_db: TenantDatabase
) -> None:
    """A follows the platform's model (no settings row of its own), B has its own: flipping the
    platform moves A, so it waits for A's sources and never for B's."""
    await upload_all(
        running,
        (None, "docs://guide", PLATFORM_GUIDE),
        (ORG_A, "docs://handbook", HANDBOOK),
        (ORG_B, "docs://handbook", HANDBOOK),
    )
    await admin.execute(
        "INSERT INTO knowledge_settings (organization_id, active_embedding_model) VALUES ($1, $2)",
        ORG_B,
        DEFAULT_MODEL,
    )
    owner = running.with_("database", owner_url=database.owner_url)
    code, out = await command(owner, "switch", "prepare", COPY, "--dimensions", "384", "--platform")
    assert code == 0, out
    code, out = await command(
        owner, "switch", "prepare", COPY, "--dimensions", "384", "--platform", "--apply"
    )
    assert code == 0, out
    assert "asked for 2 source(s)" in out, "the platform's and A's, never B's"
    await until_ready(running, "--platform")
    under_copy = await admin.fetch(
        "SELECT organization_id FROM knowledge_source_models WHERE embedding_model = $1"
        " AND status = 'ready' ORDER BY organization_id NULLS FIRST",
        COPY,
    )
    assert [r["organization_id"] for r in under_copy] == [None, ORG_A]

    await not_ready_under(admin, ORG_A, COPY)
    code, out = await command(running, "switch", "status", "--platform")
    assert (code, "follow the platform: not ready" in out) == (1, True), out
    code, out = await command(running, "switch", "flip", "--platform", "--apply")
    assert (code, "follow the platform's model are not ready" in out) == (1, True), out
    # the statement that flips checks too (a flip that raced the command's check)
    async with tenant_db.writing(PLATFORM) as tenant:
        assert await admin_steps.flip(tenant) is None
    assert await models_searched(database, ORG_A) == {DEFAULT_MODEL}

    code, out = await command(
        owner, "switch", "prepare", COPY, "--dimensions", "384", "--platform", "--apply"
    )
    assert (code, "asked for 1 source(s)" in out) == (0, True), out
    await until_ready(running, "--platform")
    code, out = await command(running, "switch", "flip", "--platform", "--apply")
    assert code == 0, out
    assert await models_searched(database, ORG_A) == {COPY}
    assert await models_searched(database, ORG_B) == {DEFAULT_MODEL}, "B keeps its own model"


async def test_an_organization_on_its_own_model_finds_its_own_and_the_platforms_documents(
    running: Config, admin: asyncpg.Connection, database: Database, tenant_db: TenantDatabase
) -> None:
    """The knowledge source after an organization's switch: its documents under its new model,
    the platform's under the platform's, in one brief; the flip refused while its source was
    not ready under the new model."""
    await upload_all(
        running, (None, "docs://guide", PLATFORM_GUIDE), (ORG_A, "docs://handbook", HANDBOOK)
    )
    source = KnowledgeContextSource(tenant_db, QueryVectors(Encoders(running.knowledge)))
    both = spec(include_organization=True, include_platform=True)

    async def models_of(query: str) -> list[tuple[str, str]]:
        items = await source.retrieve(knowledge_request(ORG_A, query), both)
        assert items
        rows = await admin.fetch(
            "SELECT c.id, s.title, c.embedding_model FROM knowledge_chunks c"
            " JOIN knowledge_sources s ON s.id = c.source_id WHERE c.id = ANY($1::bigint[])",
            [int(item.ref.id) for item in items if item.ref is not None],
        )
        return sorted((r["title"], r["embedding_model"]) for r in rows)

    question = "when does a lead become a customer, and can I get a refund?"
    assert await models_of(question) == [
        ("Handbook", DEFAULT_MODEL),
        ("Platform guide", DEFAULT_MODEL),
    ]
    scope = ("--organization", str(ORG_A))
    owner = running.with_("database", owner_url=database.owner_url)
    code, out = await command(
        owner, "switch", "prepare", COPY, "--dimensions", "384", *scope, "--apply"
    )
    assert code == 0, out
    await until_ready(running, *scope)
    await not_ready_under(admin, ORG_A, COPY)
    code, out = await command(running, "switch", "flip", *scope, "--apply")
    assert (code, "not ready under" in out) == (1, True), out
    code, out = await command(
        owner, "switch", "prepare", COPY, "--dimensions", "384", *scope, "--apply"
    )
    assert code == 0, out
    await until_ready(running, *scope)
    code, out = await command(running, "switch", "flip", *scope, "--apply")
    assert code == 0, out
    assert await models_of(question) == [("Handbook", COPY), ("Platform guide", DEFAULT_MODEL)]
    code, out = await command(running, "switch", "clean", *scope, "--apply")
    assert code == 0, out
    assert await models_of(question) == [("Handbook", COPY), ("Platform guide", DEFAULT_MODEL)]
