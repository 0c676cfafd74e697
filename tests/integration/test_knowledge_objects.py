"""Object-backed uploads: an S3 bucket on a local S3 server (moto, the way a user points the
consumer at their own endpoint) and files under the upload root; each read is tenant-checked
before a byte is read (issue 8)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from broker.topics import ensure_topics, upload_topics
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.knowledge import KnowledgeClient, UploadFailed
from tests.integration.conftest import Config, StartConsumer
from tests.integration.helpers import free_port
from tests.integration.test_knowledge_pipeline import HANDBOOK, ORG_A, ORG_B

pytestmark = pytest.mark.integration

BUCKET = "contextcore-docs"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)  # the consumer process inherits them, as a user's would
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key=f"{ORG_A}/handbook.md", Body=HANDBOOK.encode())
    client.put_object(Bucket=BUCKET, Key=f"{ORG_B}/secret.md", Body=b"# B only\n\nB's plan.")
    yield endpoint
    server.stop()


@pytest.fixture
async def uploads(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    s3: str,
    tmp_path: Path,
) -> Config:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )
    root = tmp_path / "uploads"
    root.mkdir()
    config = config.with_("upload", s3_endpoint_url=s3, s3_region="us-east-1", file_root=root)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    return config


async def test_an_s3_object_of_the_tenant_is_ingested_and_another_tenant_key_is_refused(
    uploads: Config, admin: asyncpg.Connection
) -> None:
    async with KnowledgeClient(
        bootstrap_servers=uploads.bootstrap,
        upload_topic=uploads.topics.upload,
        reply_topic_prefix=uploads.topics.reply_prefix,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    ) as client:
        ready = await client.upload(
            organization_id=ORG_A,
            title="Handbook",
            media_type="text/markdown",
            object=f"s3://{BUCKET}/{ORG_A}/handbook.md",
        )
        assert (ready.status, ready.chunks) == ("ready", 3)
        again = await client.upload(  # the same object again: the same source, re-ingested
            organization_id=ORG_A,
            title="Handbook",
            media_type="text/markdown",
            object=f"s3://{BUCKET}/{ORG_A}/handbook.md",
        )
        assert (again.source_id, again.generation) == (ready.source_id, 2)
        with pytest.raises(UploadFailed, match="must start with"):
            await client.upload(  # A names B's object: refused before a byte is read
                organization_id=ORG_A,
                title="Stolen",
                media_type="text/markdown",
                object=f"s3://{BUCKET}/{ORG_B}/secret.md",
            )
        with pytest.raises(UploadFailed, match="NoSuchKey"):
            await client.upload(
                organization_id=ORG_A,
                title="Missing",
                media_type="text/markdown",
                object=f"s3://{BUCKET}/{ORG_A}/missing.md",
            )
    keys = await admin.fetch("SELECT object_key, status FROM knowledge_sources ORDER BY object_key")
    assert [tuple(r) for r in keys] == [
        (f"{BUCKET}/{ORG_A}/handbook.md", "ready"),
        (f"{BUCKET}/{ORG_A}/missing.md", "failed"),
        (f"{BUCKET}/{ORG_B}/secret.md", "failed"),
    ]
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks") == 3
    assert "B's plan" not in str(await admin.fetch("SELECT text FROM knowledge_chunks"))


async def test_a_file_is_read_only_under_the_upload_root(uploads: Config, tmp_path: Path) -> None:
    root = tmp_path / "uploads"
    (root / "guide.md").write_text(HANDBOOK)
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nNot for upload.")
    os.symlink(outside, root / "link.md")
    async with KnowledgeClient(
        bootstrap_servers=uploads.bootstrap,
        upload_topic=uploads.topics.upload,
        reply_topic_prefix=uploads.topics.reply_prefix,
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    ) as client:
        ready = await client.upload(
            organization_id=ORG_A,
            title="Guide",
            media_type="text/markdown",
            object=(root / "guide.md").as_uri(),
        )
        assert ready.chunks == 3
        for path in (outside, root / "link.md", Path("/etc/passwd")):
            with pytest.raises(UploadFailed, match="outside the upload root"):
                await client.upload(
                    organization_id=ORG_A,
                    title="Escape",
                    media_type="text/plain",
                    object=path.as_uri(),
                )
