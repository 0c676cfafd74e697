"""``ContextBriefs`` under FastStream's ``TestKafkaBroker``: the app and a handler standing in for
the service run in memory, as a FastStream user tests an app (issue 35, item 6). The rules are
``ContextClient``'s: a fresh correlation id per request on the app's own reply topic, the
organization header, error replies raised by name, foreign and late replies ignored, the
session's position named. tests/integration/test_faststream_app.py runs it on the real broker
against the real build consumer."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable

import pytest
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker

from broker.lanes import HEADER_ORGANIZATION
from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from producers.client import BuildFailed, Session
from producers.faststream import ContextBriefs
from schemas.build import BuildReplyV1, BuildRequestV1, ErrorInfo
from schemas.context import ContextBrief, ContextPolicy, ContextRequest, ContextSubject
from schemas.errors import ClientClosed, ConfigurationError, ReplyTimeout

ORG = uuid.UUID(int=7)
REQUEST = ContextRequest(
    subject=ContextSubject(organization_id=ORG, user_id=None, trigger_id=None, definition_id=None),
    query="what changed at Acme?",
    entities=(),
)
POLICY = ContextPolicy(total_token_budget=100, sources=[])
TOPICS = TopicSettings()

Answer = Callable[[BuildRequestV1], Awaitable[bytes | None]]


def brief(text: str) -> ContextBrief:
    return ContextBrief(
        text=text, items=[], tokens=1, per_source_tokens={}, dropped={}, failed_sources=[]
    )


def app_with_service(answer: Answer) -> tuple[KafkaBroker, ContextBriefs, list[KafkaMessage]]:
    """An app's broker with ``ContextBriefs`` on it, and a handler of the build-request topic
    standing in for the service: it publishes what ``answer`` makes of each request on the
    request's ``reply_to`` (nothing for ``None``)."""
    broker = KafkaBroker("127.0.0.1:9")  # never dialled: TestKafkaBroker patches the connection
    briefs = ContextBriefs.from_settings(broker, TOPICS)
    received: list[KafkaMessage] = []

    @broker.subscriber(TOPICS.build_request)
    async def service(message: KafkaMessage) -> None:
        received.append(message)
        request = BuildRequestV1.model_validate_json(message.body)
        reply = await answer(request)
        if reply is not None:
            await broker.publish(reply, request.reply_to)

    return broker, briefs, received


async def test_a_brief_comes_back_on_the_app_s_own_reply_topic() -> None:
    async def ok(request: BuildRequestV1) -> bytes:
        return BuildReplyV1.ok(request.correlation_id, brief("Acme")).model_dump_json().encode()

    broker, briefs, received = app_with_service(ok)
    async with TestKafkaBroker(broker):
        await briefs.start()
        first = await briefs.build(REQUEST, POLICY, timeout=5)
        reply = await briefs.request(REQUEST, POLICY, timeout=5, explain=True)
    assert first.text == "Acme"
    assert reply.status == "ok"
    requests = [BuildRequestV1.model_validate_json(m.body) for m in received]
    assert [r.reply_to for r in requests] == [briefs.reply_topic] * 2
    assert re.fullmatch(rf"{re.escape(TOPICS.reply_prefix)}\.[0-9a-f]{{32}}", briefs.reply_topic)
    ids = [r.correlation_id for r in requests]
    assert len(set(ids)) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert [r.explain for r in requests] == [False, True]
    assert received[0].headers[HEADER_ORGANIZATION] == str(ORG)
    assert received[0].raw_message.key == ids[0].encode()  # type: ignore[union-attr]


async def test_an_error_reply_is_build_failed_with_the_service_s_code() -> None:
    async def refuse(request: BuildRequestV1) -> bytes:
        return (
            BuildReplyV1.failed(
                request.correlation_id,
                ErrorInfo(code="policy_rejected", message="no such source"),
            )
            .model_dump_json()
            .encode()
        )

    broker, briefs, _ = app_with_service(refuse)
    async with TestKafkaBroker(broker):
        await briefs.start()
        with pytest.raises(BuildFailed) as raised:
            await briefs.build(REQUEST, POLICY, timeout=5)
        reply = await briefs.request(REQUEST, POLICY, timeout=5)
    assert raised.value.error.code == "policy_rejected"
    assert reply.status == "error"


async def test_a_foreign_or_malformed_reply_answers_nobody() -> None:
    """A reply whose id this app never made, and one that is not a reply, are ignored: the call
    waits its time out rather than taking another's answer."""

    async def foreign(request: BuildRequestV1) -> bytes:
        return BuildReplyV1.ok("f" * 32, brief("someone else's")).model_dump_json().encode()

    async def garbage(request: BuildRequestV1) -> bytes:
        return b'{"not": "a reply"}'

    for answer in (foreign, garbage):
        broker, briefs, received = app_with_service(answer)
        async with TestKafkaBroker(broker):
            await briefs.start()
            with pytest.raises(ReplyTimeout, match=r"no reply to [0-9a-f]{32} within 0.2 s"):
                await briefs.build(REQUEST, POLICY, timeout=0.2)
        assert len(received) == 1
        assert briefs._calls.waiting == []


async def test_a_late_reply_never_answers_a_later_request() -> None:
    """The first request's answer arrives only when the second is sent: the second call must not
    take it, and gets its own."""
    first_id: list[str] = []

    async def late(request: BuildRequestV1) -> bytes | None:
        if not first_id:
            first_id.append(request.correlation_id)
            return None
        await asyncio.sleep(0)
        stale = BuildReplyV1.ok(first_id[0], brief("the first request's")).model_dump_json()
        return stale.encode()

    broker, briefs, _ = app_with_service(late)
    async with TestKafkaBroker(broker):
        await briefs.start()
        with pytest.raises(ReplyTimeout):
            await briefs.build(REQUEST, POLICY, timeout=0.2)
        with pytest.raises(ReplyTimeout):
            await briefs.build(REQUEST, POLICY, timeout=0.2)


async def test_the_session_s_latest_position_is_named() -> None:
    async def ok(request: BuildRequestV1) -> bytes:
        return BuildReplyV1.ok(request.correlation_id, brief("")).model_dump_json().encode()

    session = Session()
    session.note("0/16B3748")
    broker = KafkaBroker("127.0.0.1:9")
    briefs = ContextBriefs(broker, session=session)
    received: list[BuildRequestV1] = []

    @broker.subscriber(TOPICS.build_request)
    async def service(message: KafkaMessage) -> None:
        request = BuildRequestV1.model_validate_json(message.body)
        received.append(request)
        await broker.publish(await ok(request), request.reply_to)

    async with TestKafkaBroker(broker):
        await briefs.start()
        await briefs.build(REQUEST, POLICY, timeout=5)
        await briefs.build(REQUEST, POLICY, timeout=5, read_after="1/0")
    assert [r.read_after for r in received] == ["0/16B3748", "1/0"]


async def test_close_fails_the_waiting_calls_and_every_later_one() -> None:
    sent = asyncio.Event()

    async def never(request: BuildRequestV1) -> None:
        sent.set()

    broker, briefs, _ = app_with_service(never)
    async with TestKafkaBroker(broker):
        await briefs.start()
        waiting = asyncio.create_task(briefs.build(REQUEST, POLICY, timeout=60))
        await asyncio.wait_for(sent.wait(), 30)
        assert len(briefs._calls.waiting) == 1
        await briefs.close()  # no admin client under the test broker: no topic to delete
        with pytest.raises(ClientClosed, match=r"closed while [0-9a-f]{32} waited"):
            await waiting
        with pytest.raises(ClientClosed):
            await briefs.build(REQUEST, POLICY, timeout=60)
    assert briefs._calls.waiting == []


async def test_it_is_made_before_the_broker_starts_and_started_after() -> None:
    """A request before ``start`` could wait on a reply topic nobody made: it is refused, not
    timed out (one made once the broker runs: tests/integration/test_faststream_app.py)."""
    broker, briefs, _ = app_with_service(lambda request: asyncio.sleep(0, b""))
    with pytest.raises(ConfigurationError, match="after the broker started"):
        await briefs.start()
    async with TestKafkaBroker(broker):
        with pytest.raises(ConfigurationError, match="after_startup"):
            await briefs.build(REQUEST, POLICY, timeout=5)


def test_every_app_has_a_reply_topic_of_its_own_read_from_its_start() -> None:
    broker = KafkaBroker("127.0.0.1:9")
    first, second = ContextBriefs(broker), ContextBriefs(broker)
    assert first.reply_topic != second.reply_topic
    for briefs in (first, second):
        assert [(p.topic, p.partition) for p in briefs._subscriber.partitions] == [
            (briefs.reply_topic, 0)
        ]


def test_a_reply_topic_the_service_would_refuse_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ConfigurationError, match="no reply could ever reach this client"):
        ContextBriefs(
            KafkaBroker("127.0.0.1:9"),
            reply_topic_prefix="elsewhere",
            reply_topics=ReplyTopics.of(TOPICS),
        )
