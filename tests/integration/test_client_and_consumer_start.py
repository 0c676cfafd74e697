"""``ContextClient`` against a live consumer, and how a consumer refuses to start."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid

import pytest

from contextcore.models import ContextPolicy, ContextRequest, ContextSubject
from producers.client import BuildFailed, ContextClient, DuplicateCorrelationId, ReplyTimeout
from tests.integration.conftest import Config, Database, StartConsumer, spawn_build_consumer
from tests.integration.helpers import free_port

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
    assert "contextcore: refusing to serve: migration 00001_foundation is pending" in err
    assert "Traceback" not in err


async def test_consumer_with_an_unreachable_broker_exits_with_one_line(
    config: Config,
) -> None:
    settings = config.with_(
        "kafka", bootstrap_servers=f"127.0.0.1:{free_port()}", connect_timeout_s=2
    )
    code, err = await run_serve(settings)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(
        f"contextcore: cannot reach the Kafka broker at {settings.kafka.bootstrap_servers}: "
    )
    assert "Traceback" not in err


async def test_consumer_without_settings_exits_with_one_line(config: Config) -> None:
    settings = config.with_("kafka", bootstrap_servers=None)
    code, err = await run_serve(settings)
    assert code == 2
    assert err.strip().startswith("contextcore: CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS is not set")
    assert len(err.strip().splitlines()) == 1


async def test_a_correlation_id_in_flight_cannot_be_awaited_twice(
    config: Config, start_consumer: StartConsumer
) -> None:
    """Issue 7, defect 2: a second waiter on one id used to replace the first, and organization
    B's caller received organization A's brief. The second request is now refused."""
    await start_consumer(config)
    other = REQUEST.model_copy(
        update={"subject": REQUEST.subject.model_copy(update={"organization_id": uuid.UUID(int=8)})}
    )
    async with ContextClient.from_settings(config.kafka, config.topics) as client:
        first = asyncio.create_task(client.request(REQUEST, POLICY, timeout=30, correlation_id="X"))
        await asyncio.sleep(0)  # the first request is registered and on its way
        with pytest.raises(DuplicateCorrelationId, match="'X' already awaits a reply"):
            await client.build(other, POLICY, timeout=30, correlation_id="X")
        assert (await first).correlation_id == "X"
        again = await client.request(other, POLICY, timeout=30, correlation_id="X")  # free again
    assert again.status == "ok"


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
    assert line.startswith("contextcore: topics missing on ")
    assert config.topics.memory_write in line
    assert "CONTEXTCORE_KAFKA_CREATE_TOPICS=true" in line
