"""The pending sweep's behaviour (tests/behaviour/conftest.py runs each test in memory and on the
real broker): an upload whose embedding never completes (no embedding group runs) stays
pending; once it has waited over an hour the sweep fails it with the reason, and its uploader
hears ``failed`` on the reply topic its upload named, with its correlation id. An upload pending
for less is left alone, and each organization's uploader hears of its own source only.

Asking about an upload again (its idempotency key, a new correlation id) is answered from its
source: how a test sees what the sweep left pending once the sweep has stopped."""

from __future__ import annotations

import uuid
from typing import Any

from tests.behaviour.conftest import Rig, own_reply_topic
from tests.behaviour.test_upload import ORG, upload, upload_message

OTHER_ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000c2")
OVER_AN_HOUR = 61 * 60.0
REASON = "pending for more than an hour (since "


async def ask_again(rig: Rig, message: dict[str, Any], *, answers: int) -> dict[str, Any]:
    """The same upload (its key) asked about under a new correlation id: its source's status."""
    again = {**message, "correlation_id": f"{message['correlation_id']}-again"}
    answer = await upload(rig, again, answers=answers)
    assert answer["correlation_id"] == again["correlation_id"]
    return answer


async def test_an_upload_pending_over_an_hour_is_failed_and_its_uploader_told(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.start("upload")  # and no embedding group: nothing completes
    stale_message = upload_message("doc-stale", await own_reply_topic(rig, "stale"))
    fresh_message = upload_message("doc-fresh", await own_reply_topic(rig, "fresh"))
    stale = await upload(rig, stale_message, answers=1)
    assert stale["status"] == "pending"
    await rig.age_pending(OVER_AN_HOUR)
    fresh = await upload(rig, fresh_message, answers=1)
    assert fresh["status"] == "pending"

    await rig.start("sweep")
    pending, failed = await rig.read(stale_message["reply_to"], until=2)
    assert pending == stale
    assert (failed["correlation_id"], failed["status"]) == ("doc-stale", "failed")
    assert failed["source_id"] == stale["source_id"]
    assert failed["reason"].startswith(REASON)
    assert " chunks stored under " in failed["reason"]  # the text was cut, none embedded
    await rig.stop("sweep")  # its last sweep finished: whatever it failed, it told

    # the fresh upload was there for the sweep that failed the stale one, and is still pending
    answer = await ask_again(rig, fresh_message, answers=2)
    assert (answer["status"], answer["source_id"]) == ("pending", fresh["source_id"])
    told = await rig.read(fresh_message["reply_to"], until=2)
    assert [t["status"] for t in told] == ["pending", "pending"]
    answer = await ask_again(rig, stale_message, answers=3)
    assert (answer["status"], answer["reason"]) == ("failed", failed["reason"])


async def test_each_organizations_uploader_hears_of_its_own_source_only(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.organization(OTHER_ORG)
    await rig.start("upload")
    ours = upload_message("doc-ours", await own_reply_topic(rig, "ours"))
    theirs_topic = await own_reply_topic(rig, "theirs")
    theirs = upload_message("doc-theirs", theirs_topic, organization_id=str(OTHER_ORG))
    sources = {}
    for message in (ours, theirs):
        pending = await upload(rig, message, answers=1)
        assert pending["status"] == "pending"
        sources[message["correlation_id"]] = pending["source_id"]
    await rig.age_pending(OVER_AN_HOUR)

    await rig.start("sweep")
    for message in (ours, theirs):
        _, failed = await rig.read(message["reply_to"], until=2)
        assert failed["status"] == "failed"
        assert failed["source_id"] == sources[message["correlation_id"]]
        assert failed["reason"].startswith(REASON)
    await rig.stop("sweep")

    for message in (ours, theirs):  # nothing else was told on either topic before the answer
        await ask_again(rig, message, answers=3)
        told = await rig.read(message["reply_to"], until=3)
        cid = message["correlation_id"]
        assert [(t["correlation_id"], t["status"]) for t in told] == [
            (cid, "pending"),
            (cid, "failed"),
            (f"{cid}-again", "failed"),
        ]
