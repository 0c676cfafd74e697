"""The runtime's promises as a consumer's user sees them (tests/behaviour/conftest.py runs each
test in memory and on the real broker), on the build consumer: a consumer stopped and started
again resumes after what it committed; one that dies mid-stream loses no record."""

from __future__ import annotations

import json
from collections import Counter

from tests.behaviour.conftest import Rig, own_reply_topic
from tests.integration.helpers import request_message


async def send_requests(rig: Rig, replies: str, names: list[str]) -> None:
    for name in names:
        message = json.dumps(request_message(name, replies)).encode()
        await rig.send(rig.topics.build_request, message, key=b"one-partition")


async def test_a_consumer_stopped_and_started_again_answers_each_request_once(rig: Rig) -> None:
    replies = await own_reply_topic(rig, "restart")
    await rig.start("build")
    await send_requests(rig, replies, ["r1", "r2", "r3"])
    await rig.read(replies, until=3)
    await rig.stop("build")  # drains and commits
    await send_requests(rig, replies, ["r4", "r5"])
    await rig.start("build")

    answered = Counter(reply["correlation_id"] for reply in await rig.read(replies, until=5))
    # a record read again would be answered again: r1..r3 sit before r4 and r5 in the partition
    assert answered == Counter(["r1", "r2", "r3", "r4", "r5"])


async def test_a_consumer_that_dies_mid_stream_loses_no_request(rig: Rig) -> None:
    replies = await own_reply_topic(rig, "killed")
    names = [f"k{i}" for i in range(20)]
    await rig.start("build")
    await send_requests(rig, replies, names[:10])
    await rig.read(replies, until=1)
    await rig.stop("build", kill=True)
    await send_requests(rig, replies, names[10:])
    await rig.start("build")

    # what was in flight or not yet committed is read again and answered again: at least once
    answers = await rig.read(replies, until=len(names))
    while {answer["correlation_id"] for answer in answers} != set(names):
        answers = await rig.read(replies, until=len(answers) + 1)
    assert len(answers) <= 2 * len(names)
