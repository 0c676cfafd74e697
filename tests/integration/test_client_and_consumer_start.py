"""``ContextClient`` against a live consumer, and how a consumer refuses to start."""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from producers.client import BuildFailed, ContextClient, ReplyTimeout
from schemas.build import BuildReplyV1
from schemas.context import ContextBrief, ContextPolicy, ContextRequest, ContextSubject
from schemas.errors import PublishFailed
from tests.integration.helpers import free_port, producer, until
from tests.services import Config, Database, StartConsumer, spawn_build_consumer

pytestmark = pytest.mark.integration

REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=uuid.UUID(int=7), user_id=None, trigger_id=None, definition_id=None
    ),
    query="what changed at Acme?",
    entities=(),
)
POLICY = ContextPolicy(total_token_budget=100, sources=[])  # no source is registered yet


async def test_client_build_returns_the_brief_and_metrics_count_it(
    config: Config, start_consumer: StartConsumer
) -> None:
    settings = config.with_("build", metrics_port=free_port())
    await start_consumer(settings)
    async with ContextClient.from_settings(settings.kafka, settings.topics) as client:
        brief = await client.build(REQUEST, POLICY, timeout=30)
        replies = await asyncio.gather(
            *(client.request(REQUEST, POLICY, timeout=30) for _ in range(20))
        )
    assert brief.text == ""
    assert brief.items == []
    assert {r.status for r in replies} == {"ok"}
    assert len({r.correlation_id for r in replies}) == 20

    url = f"http://127.0.0.1:{settings.build.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert 'contextcore_build_requests_total{outcome="ok"} 21.0' in body
    assert (
        'contextcore_consumer_stage_seconds_bucket{consumer="build",le="0.005",stage="build"}'
        in body
    )
    assert 'contextcore_consumer_records_total{consumer="build",outcome="reply"} 21.0' in body


async def test_client_raises_build_failed_on_an_error_reply(
    config: Config, start_consumer: StartConsumer
) -> None:
    await start_consumer(config)
    async with ContextClient.from_settings(config.kafka, config.topics) as client:
        # The model refuses a duplicated page kind, so build a raw envelope the way a foreign
        # producer would: through the client's own publish path with a tampered policy.
        policy = POLICY.model_copy(update={"page_order": ["memory", "memory"]})
        with pytest.raises(BuildFailed) as raised:
            await client.build(REQUEST, policy, timeout=30)
    assert raised.value.error.code == "invalid_request"
    assert any("page_order" in line for line in raised.value.error.details)


async def test_client_times_out_when_nobody_answers(config: Config) -> None:
    async with ContextClient.from_settings(config.kafka, config.topics) as client:
        with pytest.raises(ReplyTimeout, match=r"no reply to \w+ within 0.5 s"):
            await client.build(REQUEST, POLICY, timeout=0.5)


async def test_a_burst_of_uploads_waits_in_the_client_and_every_one_is_sent(
    config: Config,
) -> None:
    """Issue 18: 4,679 concurrent uploads once exhausted the producer's buffer and its 40 s
    timeout (aiokafka's KafkaTimeoutError). Sends beyond ``max_in_flight`` wait in the
    client; every one reaches the topic."""
    from producers.knowledge import KnowledgeClient

    topic = f"burst-{uuid.uuid4().hex[:8]}"
    client = KnowledgeClient(
        bootstrap_servers=config.bootstrap,
        upload_topic=topic,
        reply_topic_prefix=config.topics.reply_prefix,
        max_in_flight=3,
    )
    async with client:
        assert client._producer is not None
        send = client._producer.send_and_wait
        busy, most = 0, 0

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal busy, most
            busy += 1
            most = max(most, busy)
            try:
                return await send(*args, **kwargs)
            finally:
                busy -= 1

        client._producer.send_and_wait = counted
        await asyncio.gather(
            *(client.reingest(organization_id=None, source_id=uuid.uuid4()) for _ in range(200))
        )
    assert most == 3
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=config.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        got = 0
        async with asyncio.timeout(60):
            while got < 200:
                batches = await consumer.getmany(timeout_ms=500)
                got += sum(len(records) for records in batches.values())
    finally:
        await consumer.stop()
    assert got == 200


async def test_a_request_the_broker_does_not_take_is_a_documented_error(config: Config) -> None:
    """A record the broker refuses (here: over the producer's request size) is PublishFailed,
    which the client documents, never one of aiokafka's exceptions."""
    async with ContextClient.from_settings(config.kafka, config.topics) as client:
        with pytest.raises(PublishFailed, match="did not take the request"):
            await client._send(config.topics.build_request, b"x" * 2_000_000, b"k")


async def run_serve(settings: Config) -> tuple[int, str]:
    process = await spawn_build_consumer(settings)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_consumer_refuses_to_serve_an_unmigrated_database(
    config: Config, empty_database: Database
) -> None:
    code, err = await run_serve(config.with_("database", url=empty_database.url))
    assert code == 1
    assert "contextcore serve: refusing to serve: migration 00001_foundation is pending" in err
    assert "Traceback" not in err


async def test_consumer_with_an_unreachable_broker_exits_with_one_line(
    config: Config,
) -> None:
    settings = config.with_(
        "kafka", bootstrap_servers=f"127.0.0.1:{free_port()}", connect_timeout_s=2
    )
    code, err = await run_serve(settings)
    assert code == 3  # unavailable, not a usage error
    [line] = err.strip().splitlines()
    assert line.startswith(
        f"contextcore serve: cannot reach the Kafka broker at {settings.kafka.bootstrap_servers}: "
    )
    assert "Traceback" not in err


async def test_a_consumer_started_with_the_owners_credential_exits_with_one_line(
    config: Config, database: Database
) -> None:
    """The owner's URL as CONTEXTCORE_DATABASE_URL: the start-up schema check, which becomes
    the service role, used to end in a 64-line traceback."""
    settings = config.with_("database", url=database.owner_url)
    process = await spawn_build_consumer(settings, consumer="memory")
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    [line] = err.decode().strip().splitlines()
    assert line == (
        "contextcore serve: the database login may not become the service role 'contextcore_app' "
        "(permission denied to set role): CONTEXTCORE_DATABASE_URL must name the runtime "
        "login, a member of contextcore_app, never the schema owner or an administrator"
    )


async def test_consumer_without_settings_exits_with_one_line(config: Config) -> None:
    settings = config.with_("kafka", bootstrap_servers=None)
    code, err = await run_serve(settings)
    assert code == 2
    assert err.strip().startswith(
        "contextcore serve: CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS is not set"
    )
    assert len(err.strip().splitlines()) == 1


async def test_correlation_ids_are_the_clients_and_a_late_reply_never_answers_a_later_request(
    config: Config, start_consumer: StartConsumer
) -> None:
    """Issue 7, defect 2 and issue 17, item 5: a caller that reused the correlation id of a
    request that had timed out received that request's late reply (organization A's brief
    handed to organization B's caller). The caller can no longer choose an id: each is new,
    unguessable and the client's, so a late reply is ignored."""
    other = REQUEST.model_copy(
        update={"subject": REQUEST.subject.model_copy(update={"organization_id": uuid.UUID(int=8)})}
    )
    async with ContextClient.from_settings(config.kafka, config.topics) as client:
        with pytest.raises(TypeError, match="correlation_id"):
            await client.request(other, POLICY, correlation_id="X")  # type: ignore[call-arg]
        with pytest.raises(ReplyTimeout) as timed_out:  # nobody serves yet
            await client.request(REQUEST, POLICY, timeout=0.5)
        match = re.search(r"no reply to (\S+) within", str(timed_out.value))
        assert match is not None
        first = match.group(1)
        assert re.fullmatch(r"[0-9a-f]{32}", first), first
        later = asyncio.create_task(client.request(other, POLICY, timeout=60))
        await until(lambda: client._calls.waiting)  # the later request waits
        [waiting] = client._calls.waiting
        assert waiting != first
        # A's answer arrives late, while B's request waits: exactly what the service would send
        brief = ContextBrief(
            text="A's brief",
            items=[],
            tokens=3,
            per_source_tokens={},
            dropped={},
            failed_sources=[],
        )
        send = await producer(config.bootstrap)
        try:
            sent = await send.send_and_wait(
                client.reply_topic,
                BuildReplyV1.ok(first, brief).model_dump_json().encode(),
                headers=[("correlation_id", first.encode())],
            )
        finally:
            await send.stop()
        assert client._consumer is not None
        reply_partition = TopicPartition(client.reply_topic, 0)
        async with asyncio.timeout(30):
            while True:  # until the client has read the late reply
                if await client._consumer.position(reply_partition) > sent.offset:
                    break
                await asyncio.sleep(0.01)
        assert not later.done(), "the late reply answered the later request"
        await start_consumer(config)
        reply = await later
    assert reply.status == "ok"
    assert reply.correlation_id == waiting
    assert reply.brief is not None
    assert reply.brief.text == ""  # B's own (empty) brief, never A's


async def test_a_consumer_that_may_not_create_topics_names_the_missing_ones(
    config: Config,
) -> None:
    """CONTEXTCORE_KAFKA_CREATE_TOPICS=false (k8s/: Strimzi owns the topics): the memory
    consumer, whose topics nobody made here, stops with one line naming them."""
    settings = config.with_("kafka", create_topics=False)
    process = await spawn_build_consumer(settings, consumer="memory")
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    [line] = err.decode().strip().splitlines()
    assert line.startswith("contextcore serve: topics missing on ")
    assert config.topics.memory_write in line
    assert "CONTEXTCORE_KAFKA_CREATE_TOPICS=true" in line
