"""The embedding group's behaviour (tests/behaviour/conftest.py runs each test in memory and on
the real broker): the batches an upload hands on are embedded, and the one that completes the
source answers the uploader ``ready`` on the reply topic its upload named; what cannot be read,
or names a model this group does not encode with, is dead-lettered, and the next upload is
still answered."""

from __future__ import annotations

import json
import uuid

from broker.topics import dead_letter_topic
from tests.behaviour.conftest import Rig, own_reply_topic
from tests.behaviour.test_upload import ORG, upload, upload_message


async def test_an_uploads_batches_are_embedded_and_the_uploader_hears_ready(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.start("upload")
    await rig.start("embed")
    replies = await own_reply_topic(rig, "embedded")

    pending = await upload(rig, upload_message("doc-embed", replies), answers=1)
    assert pending["status"] == "pending"
    ready = (await rig.read(replies, until=2))[-1]
    assert (ready["correlation_id"], ready["status"]) == ("doc-embed", "ready")
    assert (ready["source_id"], ready["generation"]) == (pending["source_id"], 1)
    assert ready["chunks"] > 0


async def test_a_batch_that_is_not_json_or_names_another_model_is_dead_lettered(
    rig: Rig,
) -> None:
    await rig.organization(ORG)
    await rig.start("upload")
    await rig.start("embed")
    topic = rig.topics.embed
    foreign = {
        "organization_id": str(ORG),
        "source_id": str(uuid.uuid4()),
        "generation": 1,
        "embedding_model": "no-such-model",
        "chunks": [{"ordinal": 0, "section": "Refunds", "text": "thirty days", "tokens": 3}],
    }
    await rig.send(topic, b"[1, 2", key=str(ORG).encode())
    await rig.send(topic, json.dumps(foreign).encode(), key=str(ORG).encode())

    letters = await rig.read(dead_letter_topic(topic), until=2)
    by_cause = {letter["cause"]: letter for letter in letters}
    assert sorted(by_cause) == ["not_json", "unknown_model"]
    assert by_cause["not_json"]["reason"].startswith("not JSON")
    assert "no-such-model" in by_cause["unknown_model"]["reason"]
    assert {letter["consumer_group"] for letter in letters} == {rig.group("embed")}

    replies = await own_reply_topic(rig, "embedded-after-poison")
    await upload(rig, upload_message("doc-after", replies), answers=1)
    ready = (await rig.read(replies, until=2))[-1]
    assert (ready["correlation_id"], ready["status"]) == ("doc-after", "ready")
