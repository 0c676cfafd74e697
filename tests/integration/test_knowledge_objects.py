"""Object-backed uploads: an S3 bucket on a local S3 server (moto, the way a user points the
consumer at their own endpoint) and files under the upload root. Addresses are hostile input
(issue 17): only allowed buckets, only the tenant's prefix, only regular files under the root,
and every refused or unreadable address ends in a status the uploader reads, never a silent
dead letter."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from broker.topics import ensure_topics, upload_topics
from producers.knowledge import DocumentTooLarge, KnowledgeClient, UploadFailed
from producers.staging import INLINE_BYTES, FileStage, S3Stage
from tests.integration.helpers import free_port
from tests.integration.test_knowledge_pipeline import HANDBOOK, ORG_A, ORG_B
from tests.services import Config, StartConsumer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),  # an embedding consumer loads its model first: slow on a busy machine
]

BUCKET = "contextcore-docs"
PRIVATE = "private-backups"


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
    client.create_bucket(Bucket=PRIVATE)  # the service's credentials reach it; no setting names it
    client.put_object(Bucket=PRIVATE, Key=f"{ORG_A}/payroll.md", Body=b"# Payroll\n\nSalaries.")
    yield endpoint
    server.stop()


async def orgs(admin: asyncpg.Connection) -> None:
    await admin.executemany(
        "INSERT INTO organizations (id, name) VALUES ($1, $2)", [(ORG_A, "A"), (ORG_B, "B")]
    )


@pytest.fixture
async def uploads(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    s3: str,
    tmp_path: Path,
) -> Config:
    await orgs(admin)
    root = tmp_path / "uploads"
    root.mkdir()
    config = config.with_(
        "upload",
        s3_endpoint_url=s3,
        s3_region="us-east-1",
        s3_buckets=(BUCKET,),
        file_root=root,
    )
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    return config


@pytest.fixture
async def client(uploads: Config) -> AsyncIterator[KnowledgeClient]:
    async with uploads.knowledge_client() as client:
        yield client


async def refused(client: KnowledgeClient, address: str, reason: str, status: str) -> None:
    with pytest.raises(UploadFailed, match=reason) as failure:
        await client.upload(
            organization_id=ORG_A, title="Hostile", media_type="text/markdown", object=address
        )
    assert failure.value.status.status == status, failure.value.status


async def test_an_s3_object_of_the_tenant_is_ingested_and_every_other_address_refused(
    client: KnowledgeClient, admin: asyncpg.Connection
) -> None:
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
    # refused before anything is stored or read: rejected, with the reason
    for address, reason in [
        (f"s3://{BUCKET}/{ORG_B}/secret.md", "must start with"),
        (f"s3://{PRIVATE}/{ORG_A}/payroll.md", f"'{PRIVATE}' is not one this service reads"),
        (f"s3://arn:aws:s3:us-east-1:123456789012:accesspoint/ap/{ORG_A}/x.md", "not a plain"),
        (f"s3://127.0.0.1:{free_port()}/{ORG_A}/x.md", "not a plain S3 bucket"),
        (f"s3://user:pw@{BUCKET}/{ORG_A}/x.md", "not a plain S3 bucket"),
        (f"s3://{BUCKET}/{ORG_A}/x.md%00.txt", "NUL or control character"),
    ]:
        await refused(client, address, reason, "rejected")
    # read and missing: the source fails, with the reason
    await refused(client, f"s3://{BUCKET}/{ORG_A}/missing.md", "NoSuchKey", "failed")
    keys = await admin.fetch("SELECT object_key, status FROM knowledge_sources ORDER BY object_key")
    assert [tuple(r) for r in keys] == [
        (f"{BUCKET}/{ORG_A}/handbook.md", "ready"),
        (f"{BUCKET}/{ORG_A}/missing.md", "failed"),
    ]
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks") == 3
    texts = str(await admin.fetch("SELECT text FROM knowledge_chunks"))
    assert "B's plan" not in texts
    assert "Salaries" not in texts


async def test_a_store_that_never_answers_fails_the_source_on_the_last_attempt(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, s3: str
) -> None:
    await orgs(admin)
    config = config.with_(
        "upload",
        s3_endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens
        s3_region="us-east-1",
        s3_buckets=(BUCKET,),
        max_attempts=2,
        retry_backoff_s=0.05,
    )
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    await start_consumer(config, consumer="upload")
    async with config.knowledge_client() as client:
        with pytest.raises(UploadFailed, match=r"did not answer.*\(after the last attempt\)") as no:
            await client.upload(
                organization_id=ORG_A,
                title="Handbook",
                media_type="text/markdown",
                object=f"s3://{BUCKET}/{ORG_A}/handbook.md",
            )
    assert "127.0.0.1" not in str(no.value)  # the endpoint is the operator's, not the uploader's
    assert await admin.fetchval("SELECT status FROM knowledge_sources") == "failed"


async def test_only_regular_files_under_the_upload_root_are_read(
    client: KnowledgeClient, uploads: Config, tmp_path: Path
) -> None:
    root = tmp_path / "uploads"
    mine, theirs = root / str(ORG_A), root / str(ORG_B)
    mine.mkdir()
    theirs.mkdir()
    (mine / "guide.md").write_text(HANDBOOK)
    (theirs / "secret.md").write_text("# B only\n\nB's plan.")
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nNot for upload.")
    os.symlink(outside, mine / "link.md")
    ready = await client.upload(
        organization_id=ORG_A,
        title="Guide",
        media_type="text/markdown",
        object=(mine / "guide.md").as_uri(),
    )
    assert ready.chunks == 3
    for path in (outside, Path("/etc/passwd")):
        await refused(client, path.as_uri(), "outside the upload root", "rejected")
    await refused(client, f"{mine.as_uri()}/guide.md%00.txt", "NUL", "rejected")
    await refused(client, (mine / "link.md").as_uri(), "symbolic link", "failed")
    # another tenant's folder of the shared root, as another tenant's S3 prefix (issue 18)
    await refused(client, (theirs / "secret.md").as_uri(), f"under '{ORG_A}/'", "rejected")


async def test_a_hard_link_or_a_dotted_key_never_reads_another_tenants_object(
    client: KnowledgeClient, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    """Issue 32: a hard link in A's folder to B's file is a regular file under A's folder with
    B's bytes: its source fails (one link only) and nothing of it is kept. A key whose dot
    segments a store or proxy could resolve, in any encoding, is rejected before anything is
    stored (moto serves keys literally: with a store that normalises, these read B's object)."""
    root = tmp_path / "uploads"
    mine, theirs = root / str(ORG_A), root / str(ORG_B)
    mine.mkdir()
    theirs.mkdir()
    (theirs / "secret.md").write_text("# B only\n\nB's plan.")
    os.link(theirs / "secret.md", mine / "notes.md")
    await refused(client, (mine / "notes.md").as_uri(), "the file has 2 hard links", "failed")
    for address, reason in [
        (f"s3://{BUCKET}/{ORG_A}/../{ORG_B}/secret.md", "'.' or '..' segment ('..')"),
        (f"s3://{BUCKET}/{ORG_A}/%2e%2e/{ORG_B}/secret.md", "'.' or '..' segment ('..')"),
        (f"s3://{BUCKET}/{ORG_A}%2F..%2F{ORG_B}/secret.md", "'.' or '..' segment ('..')"),
        (f"s3://{BUCKET}/{ORG_A}/\uff0e\uff0e/{ORG_B}/secret.md", "'.' or '..' segment ('..')"),
        (f"s3://{BUCKET}/{ORG_A}/..;/{ORG_B}/secret.md", "'.' or '..' segment ('..;')"),
        (f"s3://{BUCKET}/{ORG_A}//../{ORG_B}/secret.md", "'.' or '..' segment ('')"),
        (f"s3://{BUCKET}/{ORG_A}/%252e%252e/{ORG_B}/secret.md", "still percent-encoded"),
        (f"s3://{BUCKET}/{ORG_A}/..%5C{ORG_B}/secret.md", "backslash"),
        (f"{mine.as_uri()}/../{ORG_B}/secret.md", "'.' or '..' segment ('..')"),
    ]:
        await refused(client, address, re.escape(reason), "rejected")
    sources = await admin.fetch("SELECT organization_id, uri, status FROM knowledge_sources")
    assert [tuple(row) for row in sources] == [(ORG_A, (mine / "notes.md").as_uri(), "failed")]
    assert await admin.fetchval("SELECT count(*) FROM knowledge_chunks") == 0
    kept = await admin.fetchval("SELECT sections IS NULL FROM knowledge_sources")
    assert kept, "the linked file's text was not kept"


async def test_named_pipes_neither_block_nor_outlive_the_consumer(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    """Six uploads of a named pipe nothing writes to once tied up six threads for good; now each
    fails at once, the next upload is served, and SIGTERM still stops the process."""
    await orgs(admin)
    root = tmp_path / "uploads"
    (root / str(ORG_A)).mkdir(parents=True)
    config = config.with_("upload", file_root=root)
    root = root / str(ORG_A)  # the uploads' folder: the organization's
    os.mkfifo(root / "pipe.md")
    (root / "guide.md").write_text(HANDBOOK)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    upload, _ = await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    async with config.knowledge_client() as client:
        for attempt in range(6):
            with pytest.raises(UploadFailed, match="names a named pipe, not a regular file"):
                await client.upload(
                    organization_id=ORG_A,
                    title=f"Pipe {attempt}",
                    media_type="text/markdown",
                    object=(root / "pipe.md").as_uri(),
                )
        ready = await client.upload(
            organization_id=ORG_A,
            title="Guide",
            media_type="text/markdown",
            object=(root / "guide.md").as_uri(),
        )
        assert ready.status == "ready"
    assert await upload.stop() == 0


def large_markdown(path: Path, version: str) -> Path:
    """A document past what one record carries (its sections different enough to chunk)."""
    sections = [
        f"## Topic {i}\n\nVersion {version}: paragraph {i} explains setting number {i} of the"
        f" product, its default {i * 7} and the reason {i % 13} why it matters. " * 3
        for i in range(1_900)
    ]
    path.write_text("# Manual\n\n" + "\n\n".join(sections))
    assert path.stat().st_size > INLINE_BYTES
    return path


async def test_a_file_too_large_for_a_record_goes_by_reference_through_either_stage(
    client: KnowledgeClient, uploads: Config, admin: asyncpg.Connection, s3: str, tmp_path: Path
) -> None:
    """Issue 18: a file over the record's limit is refused before anything is sent, unless a
    stage is given: the upload consumer's file root, or an S3 bucket it reads; a new version
    of the same file updates the same source."""
    manual = large_markdown(tmp_path / "manual.md", "one")
    with pytest.raises(DocumentTooLarge, match="stage it"):
        await client.upload_file(manual, organization_id=ORG_A)
    assert await admin.fetchval("SELECT count(*) FROM knowledge_sources") == 0
    assert uploads.upload.file_root is not None
    on_disk = FileStage(uploads.upload.file_root)
    first = await client.upload_file(manual, organization_id=ORG_A, stage=on_disk)
    assert first.status == "ready"
    assert first.chunks is not None
    assert first.chunks > 100
    again = await client.upload_file(
        large_markdown(manual, "two"), organization_id=ORG_A, stage=on_disk
    )
    assert (again.status, again.source_id, again.generation) == ("ready", first.source_id, 2)
    assert (
        await admin.fetchval("SELECT count(*) FROM knowledge_chunks WHERE text LIKE 'Version one%'")
        == 0
    ), "the first version's chunks went with its generation"
    in_bucket = await client.upload_file(
        manual, organization_id=ORG_A, stage=S3Stage(BUCKET, s3, "us-east-1"), uri="docs://m"
    )
    assert in_bucket.status == "ready"
    key = await admin.fetchval(
        "SELECT object_key FROM knowledge_sources WHERE id = $1", in_bucket.source_id
    )
    assert key.startswith(f"{BUCKET}/{ORG_A}/"), "under the organization's prefix, as required"
