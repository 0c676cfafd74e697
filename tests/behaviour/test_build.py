"""The build consumer's behaviour (tests/behaviour/conftest.py runs each test in memory and on the
real broker): every request is answered on the topic it names, with its correlation id; what
cannot be answered is dead-lettered, and the next request is answered."""

from __future__ import annotations

import json

from broker.topics import dead_letter_topic
from tests.behaviour.conftest import Rig, own_reply_topic
from tests.integration.helpers import request_message


async def test_a_request_is_answered_on_the_topic_it_names_with_its_correlation_id(
    rig: Rig,
) -> None:
    await rig.start("build")
    replies = await own_reply_topic(rig, "plain")
    message = request_message("corr-plain-1", replies)
    message["request"]["entities"] = [{"kind": "crm.company", "id": "c1"}, {"kind": 7}, "not a ref"]
    await rig.send(rig.topics.build_request, json.dumps(message).encode())

    [reply] = await rig.read(replies, until=1)
    assert reply["correlation_id"] == "corr-plain-1"
    assert reply["status"] == "ok"
    assert reply["brief"] == {
        "text": "",
        "items": [],
        "tokens": 0,
        "per_source_tokens": {},
        "dropped": {},
        "failed_sources": [],
    }
    assert reply["dropped_entities"] == 2


async def test_malformed_json_is_dead_lettered_and_the_next_request_is_answered(
    rig: Rig,
) -> None:
    await rig.start("build")
    topic = rig.topics.build_request
    replies = await own_reply_topic(rig, "after-poison")
    # one key, so one partition: the valid request queues behind the poison one
    await rig.send(topic, b'{"correlation_id": "x", oops', key=b"k")
    await rig.send(topic, json.dumps(request_message("corr-next", replies)).encode(), key=b"k")

    [letter] = await rig.read(dead_letter_topic(topic), until=1)
    assert letter["topic"] == topic
    assert letter["offset"] == 0
    assert letter["reason"].startswith("not JSON")
    assert letter["payload"] == '{"correlation_id": "x", oops'
    assert letter["consumer_group"] == rig.group("build")
    [reply] = await rig.read(replies, until=1)
    assert (reply["correlation_id"], reply["status"]) == ("corr-next", "ok")


async def test_a_request_with_no_address_to_answer_is_dead_lettered(rig: Rig) -> None:
    await rig.start("build")
    topic = rig.topics.build_request
    nowhere = request_message("corr-nowhere", "")
    del nowhere["reply_to"]
    await rig.send(topic, json.dumps(nowhere).encode())

    [letter] = await rig.read(dead_letter_topic(topic), until=1)
    assert "reply_to" in letter["reason"]
    assert json.loads(letter["payload"])["correlation_id"] == "corr-nowhere"


async def test_an_invalid_request_with_a_readable_address_gets_an_error_reply(
    rig: Rig,
) -> None:
    await rig.start("build")
    replies = await own_reply_topic(rig, "invalid")
    message = request_message("corr-invalid", replies)
    message["policy"]["total_token_budget"] = "500"  # strict: a string is refused, not coerced
    await rig.send(rig.topics.build_request, json.dumps(message).encode())

    [reply] = await rig.read(replies, until=1)
    assert (reply["correlation_id"], reply["status"]) == ("corr-invalid", "error")
    assert reply["error"]["code"] == "invalid_request"
    assert any("policy.total_token_budget" in line for line in reply["error"]["details"])


async def test_a_policy_naming_a_source_no_one_registered_is_refused(rig: Rig) -> None:
    await rig.start("build")
    replies = await own_reply_topic(rig, "unknown-source")
    message = request_message(
        "corr-unknown",
        replies,
        policy={
            "total_token_budget": 100,
            "sources": [{"name": "crystal_ball", "token_budget": 50}],
        },
    )
    await rig.send(rig.topics.build_request, json.dumps(message).encode())

    [reply] = await rig.read(replies, until=1)
    assert (reply["correlation_id"], reply["status"]) == ("corr-unknown", "error")
    assert any("crystal_ball" in line for line in reply["error"]["details"])
