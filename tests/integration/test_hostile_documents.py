"""Hostile documents through the real upload consumer (issue 17): each bomb ends in a status the
uploader reads, under limits far below what the old readers needed, and the consumer serves
the next upload with its own memory untouched.

The limits here are the test's (3 s of CPU, 256 MB) so that a regression shows as a failed
upload, never as a slow test: the nesting bomb and the shared-stream PDF must come out ``ready``
within 3 s of CPU (they took 383 s and 217 s before), the 8 MB of flat tags must fail on the CPU
bound, not grow the consumer (it took the consumer to 1.2 GB), and the 0.8 MB PDF that inflates
to 800 MB must fail on the memory bound.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest

from broker.topics import ensure_topics, upload_topics
from producers.knowledge import UploadFailed
from tests.documents import flat_tags_html, memory_bomb_pdf, nesting_bomb_html, shared_stream_pdf
from tests.integration.helpers import Librdkafka, status_mb
from tests.integration.test_knowledge_pipeline import HANDBOOK, ORG_A
from tests.integration.test_knowledge_pipeline import upload as upload_message
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_each_bomb_ends_in_a_status_within_its_limit(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    uploads = tmp_path / "uploads"
    root = uploads / str(ORG_A)  # the organization's folder of the upload root
    root.mkdir(parents=True)
    (root / "tags.html").write_bytes(flat_tags_html(8_000_000))
    (root / "inflates.pdf").write_bytes(memory_bomb_pdf())
    config = config.with_(
        "upload",
        file_root=uploads,
        extract_cpu_s=3.0,
        extract_wall_s=60.0,
        extract_memory_mb=256,
    )
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    upload, _ = await asyncio.gather(
        start_consumer(config, consumer="upload"), start_consumer(config, consumer="embed")
    )
    async with config.knowledge_client() as client:

        async def upload_object(name: str, media_type: str) -> None:
            await client.upload(
                organization_id=ORG_A,
                title=name,
                media_type=media_type,
                object=(root / name).as_uri(),
            )

        with pytest.raises(UploadFailed, match="extraction exceeded 3 s of CPU time"):
            await upload_object("tags.html", "text/html")
        with pytest.raises(UploadFailed, match="extraction exceeded 256 MB of memory"):
            await upload_object("inflates.pdf", "application/pdf")
        nested = await client.upload(
            organization_id=ORG_A,
            title="Nested",
            media_type="text/html",
            uri="docs://nested",
            content=nesting_bomb_html(20_000).decode(),
        )
        shared = await client.upload(
            organization_id=ORG_A,
            title="Shared",
            media_type="application/pdf",
            uri="docs://shared",
            content=shared_stream_pdf(2_000, text_lines=1),
        )
        guide = await client.upload(
            organization_id=ORG_A,
            title="Guide",
            media_type="text/markdown",
            uri="docs://guide",
            content=HANDBOOK,
        )
    assert (nested.status, shared.status, guide.status) == ("ready", "ready", "ready")
    assert upload.process.returncode is None
    assert status_mb(upload.process.pid, "VmHWM") < 300, (
        "the consumer itself held a document's parse"
    )
    failed = await admin.fetch(
        "SELECT title, status_reason FROM knowledge_sources WHERE status = 'failed' ORDER BY title"
    )
    assert [r["title"] for r in failed] == ["inflates.pdf", "tags.html"]


def many_sections(count: int) -> str:
    """Tiny sections under a 1,200-character heading: each chunk repeated the heading path."""
    return "# " + "h" * 1_200 + "\n\n" + "## s\n\nw\n\n" * count


@pytest.mark.timeout(600)
async def test_many_small_sections_are_bounded_in_chunks_and_in_the_consumers_memory(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    """A 300 KB document of 33,000 sections made 33,000 chunks, a 64 MB extraction answer, and
    four of them took an upload consumer from 57 to 497 MB (issue 32). Now it fails on the
    document's chunk limit, and four of 9,000 sections (under it) are accepted with each heading
    sent once: the consumer's peak stays under 300 MB."""
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'A')", ORG_A)
    await ensure_topics(config.bootstrap, upload_topics(config.topics))
    consumer = await start_consumer(config, consumer="upload")  # no embedding group: pending
    reply_to = config.reply_topic("sections")
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    sent = {f"over-{i}": 33_000 for i in range(4)} | {f"under-{i}": 9_000 for i in range(4)}
    try:
        for name, count in sent.items():
            text = {"text": many_sections(count)}
            message = upload_message(
                name, reply_to, key=name, title=name, uri=f"docs://{name}", content=text
            )
            await asyncio.to_thread(
                client.send, config.topics.upload, json.dumps(message).encode(), name.encode()
            )
        replies = {name: await asyncio.to_thread(client.reply, name, 300.0) for name in sent}
    finally:
        await asyncio.to_thread(client.close)
    peak = status_mb(consumer.process.pid, "VmHWM")
    print(f"the upload consumer's peak: {peak:.0f} MB")
    assert peak < 300, f"the upload consumer peaked at {peak:.0f} MB"
    for name, reply in replies.items():
        if name.startswith("over"):
            assert reply["status"] == "failed", reply
            assert "more than 10,000 passages" in reply["reason"]
        else:
            assert reply["status"] == "pending", reply
