"""The upload consumer's behaviour (tests/behaviour/conftest.py runs each test in memory and on
the real broker): an upload is answered on its reply topic with its correlation id, and its
chunks go to the embedding group's topic in batches of its source's generation; the same upload
again is answered from its source, no new generation; what cannot be read is dead-lettered, and
the next upload is answered."""

from __future__ import annotations

import json
import uuid
from typing import Any

from broker.topics import dead_letter_topic
from tests.behaviour.conftest import Rig, own_reply_topic

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000c1")


def upload_message(correlation_id: str, reply_to: str, **fields: Any) -> dict[str, Any]:
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(ORG),
        "title": "Refunds",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://{correlation_id}",
        "content": {"text": "# Refunds\n\nRefunds are paid within thirty days of a request."},
        **fields,
    }


async def upload(rig: Rig, message: dict[str, Any], *, answers: int) -> dict[str, Any]:
    await rig.send(rig.topics.upload, json.dumps(message).encode(), key=str(ORG).encode())
    replies = await rig.read(message["reply_to"], until=answers)
    return replies[-1]


async def test_an_upload_is_answered_pending_and_its_chunks_handed_to_the_embedding_group(
    rig: Rig,
) -> None:
    await rig.organization(ORG)
    await rig.start("upload")
    replies = await own_reply_topic(rig, "upload")

    pending = await upload(rig, upload_message("doc-1", replies), answers=1)
    assert (pending["correlation_id"], pending["status"]) == ("doc-1", "pending")
    assert pending["generation"] == 1
    batches = await rig.read(rig.topics.embed, until=1)
    assert {(b["source_id"], b["generation"]) for b in batches} == {(pending["source_id"], 1)}
    assert all(b["organization_id"] == str(ORG) and b["chunks"] for b in batches)
    text = " ".join(chunk["text"] for b in batches for chunk in b["chunks"])
    assert "thirty days" in text

    again = await upload(
        rig, {**upload_message("doc-1", replies), "correlation_id": "doc-1-again"}, answers=2
    )
    assert (again["correlation_id"], again["source_id"]) == ("doc-1-again", pending["source_id"])
    assert again["status"] == "pending"
    # a redelivery is not a new generation: it hands the same batches on (the embedding group
    # stores chunks idempotently), in case the first ones were not all published
    both = await rig.read(rig.topics.embed, until=2 * len(batches))
    assert sorted(map(json.dumps, both)) == sorted(map(json.dumps, batches * 2))


async def test_an_upload_that_does_not_validate_is_rejected(rig: Rig) -> None:
    await rig.start("upload")
    replies = await own_reply_topic(rig, "upload-rejected")
    no_scope_owner = upload_message("doc-orphan", replies, organization_id=None)
    rejected = await upload(rig, no_scope_owner, answers=1)
    assert (rejected["correlation_id"], rejected["status"]) == ("doc-orphan", "rejected")
    assert rejected["source_id"] is None
    assert any("organization_id" in line for line in rejected["details"])


async def test_malformed_json_is_dead_lettered_and_the_next_upload_is_answered(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.start("upload")
    topic = rig.topics.upload
    replies = await own_reply_topic(rig, "upload-after-poison")
    await rig.send(topic, b"[1, 2", key=str(ORG).encode())
    pending = await upload(rig, upload_message("doc-next", replies), answers=1)
    assert (pending["correlation_id"], pending["status"]) == ("doc-next", "pending")

    [letter] = await rig.read(dead_letter_topic(topic), until=1)
    assert letter["reason"].startswith("not JSON")
    assert letter["consumer_group"] == rig.group("upload")
