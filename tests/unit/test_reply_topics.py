"""The reply-topic rule (broker/reply_topics.py) and every place that applies it, without a broker:
the rule itself (with hypothesis), its settings, the clients, the decoder every request consumer
reads through, the delivery's reply and farewell paths, and the knowledge status ``tell``."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.reply_topics import CLIENT_ID_EXAMPLE, ReplyTopics, client_reply_topic
from broker.settings import TopicSettings
from consumers.knowledge.replies import rejected, tell
from consumers.runtime.decoding import DEAD_LETTER_CAUSES, decode_request
from consumers.runtime.delivery import RUNTIME_DEAD_LETTER_CAUSES
from consumers.runtime.records import DeadLetter, Inbound, Outcome, Reply, Retry
from producers.client import ContextClient
from schemas.envelope import KAFKA_TOPIC_PATTERN, DeadLetterV1, Envelope, printable
from schemas.errors import ConfigurationError
from tests.unit.runtime_fakes import FakePublisher, Message, Rig, Scripted, record

TOPICS = TopicSettings.model_construct(
    build_request="t.build-request",
    upload="t.upload",
    memory_write="t.memory-write",
    embed="t.embed",
    reply_prefix="t.reply",
)
RULE = ReplyTopics.of(TOPICS)
OWN = ["t.build-request", "t.upload", "t.memory-write", "t.embed"]
FORBIDDEN = [
    "__consumer_offsets",
    "__transaction_state",
    *OWN,
    *(f"{topic}.dlt" for topic in OWN),
    "t.reply.someone.dlt",
    "t.reply",  # the prefix itself is no reply topic under it
    "t.reply.",
    "t.replyx.a",
    "elsewhere",
    "contextcore.reply.a",  # another deployment's prefix
]

topic_names = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)
candidates = (
    topic_names
    | st.sampled_from(FORBIDDEN)
    | st.builds(lambda tail: f"t.reply.{tail}", topic_names)
    | st.builds(lambda tail: f"__{tail}", topic_names)
    | st.builds(
        lambda own, tail: f"{own}{tail}", st.sampled_from(OWN), st.sampled_from(["", ".dlt"])
    )
    | st.text(max_size=300)
)
patterns = st.sampled_from([None, ".*", r"t\..*", r"[a-z0-9._]+", r"t\.reply\..*|__.*|t\.embed.*"])


def accepted_invariants(rule: ReplyTopics, name: str, own: set[str]) -> None:
    assert re.fullmatch(KAFKA_TOPIC_PATTERN.strip("^$"), name)
    assert name not in (".", "..")
    assert not name.startswith("__")
    assert name not in own
    assert not name.endswith(".dlt")
    assert rule.pattern.fullmatch(name)


@given(name=candidates, pattern=patterns)
def test_a_name_the_rule_accepts_is_a_topic_of_a_caller(name: str, pattern: str | None) -> None:
    rule = ReplyTopics.of(TOPICS.model_copy(update={"reply_pattern": pattern}))
    refusal = rule.refusal(name)
    if refusal is None:
        accepted_invariants(rule, name, set(OWN))
    else:
        assert repr(printable(name)[:260]) in refusal  # the reason names the topic


@pytest.mark.parametrize("name", FORBIDDEN)
def test_internal_own_dead_letter_and_foreign_topics_are_refused(name: str) -> None:
    assert not RULE.allows(name)


@pytest.mark.parametrize(
    "name", ["__consumer_offsets", *OWN, *(f"{topic}.dlt" for topic in OWN), "t.reply.x.dlt"]
)
def test_the_explicit_refusals_win_over_a_pattern_that_admits_everything(name: str) -> None:
    everything = ReplyTopics.of(TOPICS.model_copy(update={"reply_pattern": ".*"}))
    assert not everything.allows(name)
    assert everything.allows("anything.else")


def test_the_reasons_name_the_topic_and_the_rule() -> None:
    assert RULE.refusal("__consumer_offsets") == (
        "'__consumer_offsets' is internal to Kafka (a name starting '__')"
    )
    assert RULE.refusal("t.embed") == "'t.embed' is one of the service's own topics"
    assert "a dead-letter topic" in (RULE.refusal("t.upload.dlt") or "")
    assert "must match 't\\\\.reply\\\\.[A-Za-z0-9._-]+' in full" in (RULE.refusal("x") or "")
    assert "is not a Kafka topic name" in (RULE.refusal("t.reply.a\n") or "")


@given(client_id=st.uuids().map(lambda u: u.hex))
def test_every_client_reply_topic_is_allowed(client_id: str) -> None:
    assert RULE.allows(client_reply_topic("t.reply", client_id))
    assert ReplyTopics.of(TopicSettings()).allows(
        client_reply_topic("contextcore.reply", client_id)
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PATTERN", "(", "is not a regular expression"),
        ("PATTERN", r"other\..*", "refuses the clients' own reply topics"),
        ("PATTERN", "", "refuses the clients' own reply topics"),
        ("PREFIX", "__replies", "internal to Kafka"),
        ("PREFIX", "a prefix", "is not a Kafka topic name"),
        ("PREFIX", "x" * 220, "is not a Kafka topic name"),
    ],
)
def test_a_rule_no_client_can_use_is_a_configuration_error_at_load(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(f"CONTEXTCORE_TOPIC_REPLY_{variable}", value)
    with pytest.raises(ConfigurationError, match=message):
        TopicSettings()


def test_the_pattern_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTCORE_TOPIC_REPLY_PATTERN", r"contextcore\.reply\.[0-9a-f]{32}")
    rule = ReplyTopics.of(TopicSettings())
    assert rule.allows(client_reply_topic("contextcore.reply", CLIENT_ID_EXAMPLE))
    assert not rule.allows("contextcore.reply.chosen-by-the-caller")


def test_a_client_never_makes_a_reply_topic_the_rule_refuses() -> None:
    client = ContextClient(request_topic="t.build-request", bootstrap_servers="unused:1")
    assert client.reply_topic.startswith("contextcore.reply.")
    only_the_example = re.escape(client_reply_topic("t.reply", CLIENT_ID_EXAMPLE))
    strict = ReplyTopics.of(TOPICS.model_copy(update={"reply_pattern": only_the_example}))
    with pytest.raises(ConfigurationError, match="no reply could ever reach this client"):
        ContextClient(
            request_topic="t.build-request",
            bootstrap_servers="unused:1",
            reply_topic_prefix="t.reply",
            reply_topics=strict,
        )
    with pytest.raises(ConfigurationError, match="internal to Kafka"):
        ContextClient(
            request_topic="t", bootstrap_servers="unused:1", reply_topic_prefix="__replies"
        )


# ------------------------------------------------------------------------------ at intake


def refuse(
    topic: str, correlation_id: str, message: str, details: list[str], data: object
) -> Reply:
    return Reply(topic, correlation_id, Message(text=message))


def intake(message: Any) -> Envelope | Reply | DeadLetter:
    value = message if isinstance(message, bytes) else json.dumps(message).encode()
    return decode_request(value, Envelope.model_validate, "request", refuse, reply_topics=RULE)


@pytest.mark.parametrize("reply_to", FORBIDDEN)
def test_a_request_naming_a_forbidden_reply_topic_is_dead_lettered_unanswered(
    reply_to: str,
) -> None:
    for message in (
        {"correlation_id": "c", "reply_to": reply_to},  # valid
        {"correlation_id": "c", "reply_to": reply_to, "extra": 1},  # invalid
        {"correlation_id": "c", "reply_to": reply_to, "n": "@"},  # not JSON we accept
    ):
        value = json.dumps(message).encode().replace(b'"@"', b"9" * 30)
        outcome = intake(value)
        assert isinstance(outcome, DeadLetter), message
        assert outcome.cause == "reply_to_refused"
        assert reply_to in outcome.reason


def test_an_allowed_reply_topic_is_answered_as_before() -> None:
    assert intake({"correlation_id": "c", "reply_to": "t.reply.me"}) == Envelope(
        correlation_id="c", reply_to="t.reply.me"
    )
    assert isinstance(intake({"correlation_id": "c", "reply_to": "t.reply.me", "x": 1}), Reply)
    unusable = intake({"correlation_id": "c", "reply_to": "not a topic"})
    assert isinstance(unusable, DeadLetter)
    assert unusable.cause == "invalid"


def test_the_new_cause_starts_at_zero_with_the_others() -> None:
    assert "reply_to_refused" in DEAD_LETTER_CAUSES
    assert "reply_to_refused" in RUNTIME_DEAD_LETTER_CAUSES


# ------------------------------------------------------------------------------ at publish


def rule_rig(outcome: Any) -> Rig:
    return Rig(Scripted(outcome), reply_topics=RULE)


async def test_the_delivery_publishes_no_reply_to_a_forbidden_topic() -> None:
    def answer(record: Inbound) -> Outcome:
        topic = ["__consumer_offsets", "t.embed", "t.reply.ok"][record.offset]
        return Reply(topic, f"c-{record.offset}", Message(text="a brief"))

    rig = rule_rig(answer)
    for offset in range(3):
        await rig.delivery.submit(record(offset))
    await rig.settle()
    assert [sent.topic for sent in rig.publisher.sent if sent.topic != "t.dlt"] == ["t.reply.ok"]
    letters = [DeadLetterV1.model_validate_json(s.value) for s in rig.publisher.to("t.dlt")]
    assert sorted((letter.offset, letter.cause) for letter in letters) == [
        (0, "reply_to_refused"),
        (1, "reply_to_refused"),
    ]
    assert "'__consumer_offsets' is internal to Kafka" in letters[0].reason + letters[1].reason
    assert rig.committer.last() == 3
    await rig.close()


async def test_no_farewell_goes_to_a_forbidden_topic() -> None:
    class Handler(Scripted):
        def farewell(self, record: Inbound, reason: str) -> Reply | None:
            return Reply("t.upload", "c", Message(text=reason))

    rig = Rig(Handler(lambda r: Retry("handler_error", "boom")), max_attempts=1, reply_topics=RULE)
    await rig.delivery.submit(record(0))
    await rig.settle()
    assert [s.topic for s in rig.publisher.sent] == ["t.dlt"]  # the letter, no farewell
    assert DeadLetterV1.model_validate_json(rig.publisher.sent[0].value).cause == "gave_up"
    await rig.close()


async def test_a_status_told_outside_a_record_goes_only_to_an_allowed_topic() -> None:
    publisher = FakePublisher()
    status = rejected("c-1", "superseded")
    why = await tell(publisher, RULE, "t.embed", status)
    assert why is not None
    assert "'t.embed' is one of the service's own topics" in why
    assert publisher.sent == []
    assert await tell(publisher, RULE, "t.reply.uploader", status) is None
    [sent] = publisher.sent
    assert (sent.topic, sent.headers["correlation_id"]) == ("t.reply.uploader", b"c-1")


def test_uuid_hex_is_what_the_example_client_id_looks_like() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", CLIENT_ID_EXAMPLE)
    assert len(uuid.uuid4().hex) == len(CLIENT_ID_EXAMPLE)
