"""Records that used to stall their partition, and a fuzzer that looks for new ones, through the
real broker and a real consumer process, sent by a librdkafka client (issue 7, defect 1).

Each poison record must end in a reply or a bounded dead letter, and the valid request queued
behind it on the same partition must still be answered; the consumer never dies. The fuzzer
also names reply topics the reply-topic rule refuses (issue 32): nothing may be written there.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.reply_topics import ReplyTopics, is_topic_name
from broker.settings import TopicSettings
from broker.topics import dead_letter_topic
from schemas import wire
from tests.integration import seed
from tests.integration.helpers import (
    ORG,
    Librdkafka,
    read_json,
    replies_among,
    request_message,
    settled,
)
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

DIGITS = "9" * 4_301


def text_of(message: dict[str, Any], **raw: str) -> bytes:
    """``message`` as JSON, with each ``"@name@"`` placeholder replaced by raw JSON text (what
    ``json.dumps`` would refuse to write: huge integers, deep nesting)."""
    text = json.dumps(message)
    for name, value in raw.items():
        text = text.replace(f'"@{name}@"', value)
    return text.encode()


def valid(correlation_id: str, reply_to: str) -> bytes:
    return json.dumps(request_message(correlation_id, reply_to)).encode()


async def test_each_poison_record_is_settled_and_the_next_request_answered(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    org = uuid.UUID(ORG)
    await seed.insert(admin, "organizations", id=org, name="Org")
    company = await seed.company(admin, org, name="Acme")
    reply_to = config.reply_topic("poison")
    application = {
        "total_token_budget": 200,
        "sources": [{"name": "application", "token_budget": 200}],
    }
    history = {
        "total_token_budget": 200,
        "sources": [{"name": "run_history", "token_budget": 200}],
    }

    def envelope(correlation_id: str, **changes: Any) -> dict[str, Any]:
        return request_message(correlation_id, reply_to, **changes)

    surrogate_label = envelope("surrogate-label", policy=application)
    surrogate_label["request"]["entities"] = [
        {"kind": "crm.company", "id": str(company), "label": "\ud800"},
        {"kind": "crm.company", "id": str(company)},
    ]
    nul_id = envelope("nul-id", policy=history)
    nul_id["request"]["subject"]["user_id"] = str(uuid.uuid4())
    nul_id["request"]["entities"] = [{"kind": "crm.company", "id": "c1\u0000"}]
    surrogate_key = envelope(
        "surrogate-key",
        policy={
            "total_token_budget": 10,
            "sources": [{"name": "run_history", "token_budget": 5, "options": {"\ud800": 1}}],
        },
    )
    deep_inside = envelope("deep-inside")
    deep_inside["request"]["query"] = "@deep@"
    huge = envelope("huge-int")
    huge["policy"]["total_token_budget"] = "@digits@"
    cases: list[tuple[str, bytes]] = [
        ("huge-int", text_of(huge, digits=DIGITS)),
        ("deep-alone", b"[" * 1_000 + b"]" * 1_000),
        ("deep-inside", text_of(deep_inside, deep="[" * 1_000 + "]" * 1_000)),
        ("surrogate-key", json.dumps(surrogate_key).encode()),
        ("surrogate-label", json.dumps(surrogate_label).encode()),
        ("nul-id", json.dumps(nul_id).encode()),
        ("not-json-1mb", b"\x00not json!" * 100_000),
        ("bad-headers", json.dumps(envelope("bad-headers")).encode()),
    ]
    headers: dict[str, list[tuple[str, str | bytes | None]]] = {
        # invalid UTF-8 and a null value: FastStream's own parser used to choke on both, skip
        # the record, and let a later commit pass it
        "bad-headers": [("x-binary", b"\xff\xfe"), ("x-null", None), ("contextcore-attempt", b"9")],
    }
    consumer = await start_consumer(config)
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    positions: dict[str, tuple[int, int]] = {}
    try:
        for name, value in cases:
            positions[name] = await asyncio.to_thread(
                client.send, config.request_topic, value, b"one-partition", headers.get(name)
            )
            after = f"after-{name}"
            await asyncio.to_thread(
                client.send, config.request_topic, valid(after, reply_to), b"one-partition"
            )
            answer = await asyncio.to_thread(client.reply, after)
            assert answer["status"] == "ok", name
        for name in ("huge-int", "surrogate-key", "surrogate-label", "nul-id", "bad-headers"):
            await asyncio.to_thread(client.reply, name)  # replies may overtake each other
        replies = client.replies
    finally:
        await asyncio.to_thread(client.close)
    assert consumer.process.returncode is None  # alive

    assert replies["huge-int"]["error"]["code"] == "invalid_request"
    assert "out of range" in replies["huge-int"]["error"]["details"][0]
    assert replies["surrogate-key"]["error"]["code"] == "invalid_request"
    assert "lone surrogate" in replies["surrogate-key"]["error"]["details"][0]
    # a malformed ref is dropped at the boundary; the one that resolves is still read
    assert replies["surrogate-label"]["status"] == "ok"
    assert replies["surrogate-label"]["dropped_entities"] == 1
    assert "name: Acme" in replies["surrogate-label"]["brief"]["text"]
    assert replies["nul-id"]["status"] == "ok"
    assert replies["nul-id"]["dropped_entities"] == 1
    assert replies["nul-id"]["brief"]["failed_sources"] == []
    assert replies["bad-headers"]["status"] == "ok"

    letters = await read_json(config.bootstrap, dead_letter_topic(config.request_topic), until=3)
    by_offset = {(letter["partition"], letter["offset"]): letter for letter in letters}
    for name, cause in [
        ("deep-alone", "too_deep"),
        ("deep-inside", "too_deep"),
        ("not-json-1mb", "not_json"),
    ]:
        letter = by_offset[positions[name]]
        assert letter["cause"] == cause, name
        assert letter["consumer_group"] == config.build.group_id
    big = by_offset[positions["not-json-1mb"]]
    assert (big["payload_bytes"], big["payload_truncated"]) == (1_000_000, True)
    assert len(big["payload"].encode()) <= config.build.dead_letter_payload_bytes


# ---------------------------------------------------------------------------------- fuzzing

MUTATION_TARGETS = [
    ("correlation_id",),
    ("request",),
    ("request", "query"),
    ("request", "subject", "organization_id"),
    ("request", "entities"),
    ("policy",),
    ("policy", "total_token_budget"),
    ("policy", "sources"),
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["\x00", "\ud800"])),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)


def foreign_reply_topics(topics: TopicSettings) -> st.SearchStrategy[str]:
    """Topic names the reply-topic rule refuses: Kafka's internal ones, the service's own and
    their dead-letter topics, look-alikes of those and of the reply prefix, and any other name
    outside the reply pattern."""
    rule = ReplyTopics.of(topics)
    own = [topics.build_request, topics.upload, topics.memory_write, topics.embed]
    named = ["__consumer_offsets", "__transaction_state", *own, *map(dead_letter_topic, own)]
    tails = st.from_regex(r"[A-Za-z0-9._-]{0,20}", fullmatch=True)
    heads = st.sampled_from(["__", topics.reply_prefix, f"{topics.reply_prefix}.x", *own])
    anything = st.from_regex(r"[A-Za-z0-9._-]{1,60}", fullmatch=True)
    return (st.sampled_from(named) | st.builds(str.__add__, heads, tails) | anything).filter(
        lambda name: is_topic_name(name) and not rule.allows(name)
    )


def named_reply_topics(value: bytes, own: str) -> set[str]:
    """The reply topic a record names, when it is not ``own`` and could be written to."""
    address = wire.address_of(value)
    return set() if address is None or address[0] == own else {address[0]}


@st.composite
def poison(
    draw: st.DrawFn, reply_to: str, correlation_id: str, foreign: st.SearchStrategy[str]
) -> bytes:
    """A record a careless or hostile producer could send; ``foreign``: reply topics the
    service must refuse."""
    kind = draw(
        st.sampled_from(
            [
                *("bytes", "value", "huge", "deep", "surrogate", "nul", "oversize"),
                *("bad_address", "foreign_address"),
            ]
        )
    )
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=3_000))
    if kind == "oversize":
        return draw(st.sampled_from([b"{", b"[", b"\xff", b'"'])) * draw(
            st.integers(300_000, 990_000)
        )
    message = request_message(correlation_id, reply_to)
    if kind == "foreign_address":  # valid, or not: never answered there
        message["reply_to"] = draw(foreign)
        if draw(st.booleans()):
            message["policy"] = draw(json_values)
        return json.dumps(message).encode()
    if kind == "bad_address":
        message["reply_to"] = draw(
            st.sampled_from(["", ".", "x" * 300, "\ud800", 7, None, ["a"], "a b"])
        )
        return json.dumps(message).encode()
    path = draw(st.sampled_from(MUTATION_TARGETS))
    parent = message
    for step in path[:-1]:
        parent = parent[step]
    raw: dict[str, str] = {}
    if kind == "value" and path == ("correlation_id",):
        # a string here would be a valid id, answered under another name: keep it invalid
        parent[path[-1]] = draw(st.none() | st.integers() | st.lists(st.booleans(), max_size=2))
    elif kind == "value":
        parent[path[-1]] = draw(json_values)
    elif kind == "huge":
        parent[path[-1]] = "@raw@"
        raw["raw"] = draw(st.sampled_from(["-", ""])) + "9" * draw(st.integers(19, 6_000))
    elif kind == "deep":
        depth = draw(st.integers(60, 3_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        parent[path[-1]] = "@raw@"
        raw["raw"] = opener * depth + "1" + closer * depth
    elif kind == "surrogate":
        parent[path[-1]] = {"\ud800": "\udfff"} if draw(st.booleans()) else "a\udbff"
    else:  # nul
        parent[path[-1]] = "\x00" * draw(st.integers(1, 3))
    return text_of(message, **raw)


@pytest.mark.timeout(600)
async def test_fuzzed_records_never_stall_a_partition_and_each_one_is_settled(
    config: Config, start_consumer: StartConsumer
) -> None:
    reply_to = config.reply_topic("fuzz")
    consumer = await start_consumer(config)
    client = await asyncio.to_thread(Librdkafka, config.bootstrap, reply_to)
    sent: dict[str, tuple[int, int]] = {}
    foreign = foreign_reply_topics(config.topics)
    named: set[str] = set()  # the other reply topics the records named
    run = uuid.uuid4().hex[:8]  # __consumer_offsets is the broker's: ids no other run sends

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=False,
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        correlation_id = f"fuzz-{run}-{len(sent)}"
        value = data.draw(poison(reply_to, correlation_id, foreign))
        named.update(named_reply_topics(value, reply_to))
        key = data.draw(st.sampled_from([b"a", b"b", b"c"]))
        headers = data.draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["x", "correlation_id", "contextcore-attempt", "reply_to"]),
                    st.none() | st.binary(max_size=40),
                ),
                max_size=3,
            )
        )
        sent[correlation_id] = client.send(config.request_topic, value, key, headers)
        after = f"after-{correlation_id}"
        client.send(config.request_topic, valid(after, reply_to), key)
        assert client.reply(after)["status"] == "ok"

    try:
        await asyncio.to_thread(fuzz)
        # Every fuzzed record was settled: a reply with its correlation id, or a dead letter at
        # its position (a mutation may have destroyed the address). Nothing was lost or retried.
        _, letters = await settled(
            client, config.bootstrap, dead_letter_topic(config.request_topic), sent
        )
    finally:
        await asyncio.to_thread(client.close)
    assert consumer.process.returncode is None
    # nothing failed in a way worth retrying (forged attempt headers change nothing then)
    assert not {letter["cause"] for letter in letters} & {"gave_up", "retry_refused"}
    assert named  # the fuzzer did name other reply topics (about one record in ten)
    assert await replies_among(config.bootstrap, named, sent) == []  # none outside the rule
    assert "Traceback" not in consumer.log()
