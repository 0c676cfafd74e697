"""The dev stack's hot standby (issue 34, devstack/replica.py): a streaming replica of the
embedded PostgreSQL, started as the other services are, and the build consumer's sources read
from it when ``CONTEXTCORE_DATABASE_READ_URL`` names it. With the standby's replay delayed, a
caller still reads what it was told is written (read-your-writes: the position its answers
carry, consumers/build/read_after.py)."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import pytest

from broker.settings import TopicSettings
from broker.topics import all_topics, build_topics, ensure_topics, memory_topics, upload_topics
from devstack.replica import on_standby
from devstack.stack import DevStack
from producers.client import ChannelOptions, ContextClient, Session, channel_options
from producers.knowledge import KnowledgeClient
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate
from tests.integration import seed
from tests.integration.helpers import (
    free_port,
    producer,
    read_json,
    request_message,
    until_true,
)
from tests.services import Config, Database, Services, StartConsumer, _exclusive

pytestmark = pytest.mark.integration

STANDBY = "CONTEXTCORE_TEST_STANDBY_PORT"
"""Against services of one's own (CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS, ..._ADMIN_URL), the
port of a hot standby of that PostgreSQL, on its host."""


@pytest.fixture(scope="session")
async def standby_port(services: Services) -> int:
    """The standby's port: the dev stack's, started here if it does not run (under the stack's
    lock: the workers of one run take turns). A run that started the stack stops it, standby
    included; on a stack that was already up, the standby stays up, as the stack does."""
    own = ("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS", "CONTEXTCORE_DATABASE_ADMIN_URL")
    if all(os.environ.get(name) for name in own):  # as the services fixture decides
        if not os.environ.get(STANDBY):
            pytest.skip(f"services of one's own and no standby named in {STANDBY}")
        return int(os.environ[STANDBY])
    stack = DevStack()
    async with _exclusive(stack.home / "pytest.lock"):
        await stack.up(all_topics(TopicSettings()), replica=True)
    return stack.settings.replica_port


@pytest.fixture
def read_url(database: Database, standby_port: int) -> str:
    """The runtime login on this test's database on the standby: the consumer's
    ``CONTEXTCORE_DATABASE_READ_URL``."""
    return on_standby(database.url, standby_port)


@pytest.fixture
async def standby(database: Database, standby_port: int) -> AsyncIterator[asyncpg.Connection]:
    """A superuser on this test's database on the standby, once it has been replayed there;
    one test at a time (a test pauses the standby's replay, which every database shares)."""
    url = on_standby(database.admin_url, standby_port)
    connection: asyncpg.Connection | None = None

    async def replayed() -> bool:
        nonlocal connection
        try:
            connection = await asyncpg.connect(url)
        except asyncpg.InvalidCatalogNameError:  # the database is not there yet
            return False
        return True

    async with _exclusive(DevStack().home / "standby-replay.lock"):
        await until_true(replayed)
        assert connection is not None
        try:
            await undelayed(connection)  # a run killed in a test may have left one set
            yield connection
        finally:
            try:
                await connection.execute("SELECT pg_wal_replay_resume()")
                await undelayed(connection)
            finally:
                await connection.close()


async def has_company(connection: asyncpg.Connection, company: uuid.UUID) -> bool:
    found = await connection.fetchval("SELECT count(*) FROM crm_companies WHERE id = $1", company)
    return bool(found)


async def build(config: Config, correlation_id: str, org: uuid.UUID, *companies: uuid.UUID) -> str:
    """One build of the application source over ``companies``; its brief's text."""
    reply_topic = config.reply_topic(correlation_id)
    message = request_message(
        correlation_id,
        reply_topic,
        policy={
            "total_token_budget": 400,
            "sources": [{"name": "application", "token_budget": 400}],
        },
    )
    message["request"]["subject"]["organization_id"] = str(org)
    message["request"]["entities"] = [{"kind": "crm.company", "id": str(c)} for c in companies]
    send = await producer(config.bootstrap)
    try:
        await send.send_and_wait(config.request_topic, json.dumps(message).encode())
    finally:
        await send.stop()
    [reply] = await read_json(config.bootstrap, reply_topic, until=1)
    assert reply["status"] == "ok", reply
    return str(reply["brief"]["text"])


async def test_the_standby_streams_from_the_primary_and_refuses_writes(
    database: Database, admin: asyncpg.Connection, standby: asyncpg.Connection
) -> None:
    assert await standby.fetchval("SELECT pg_is_in_recovery()") is True
    assert await admin.fetchval("SELECT pg_is_in_recovery()") is False
    org, company = uuid.uuid4(), uuid.uuid4()
    await seed.insert(admin, "organizations", id=org, name="Org")
    await seed.insert(admin, "crm_companies", organization_id=org, id=company, name="Streamed")
    await until_true(lambda: has_company(standby, company))
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        await standby.execute("DELETE FROM crm_companies WHERE id = $1", company)


async def test_the_build_reads_its_sources_on_the_standby(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    standby: asyncpg.Connection,
    read_url: str,
) -> None:
    """With the standby's replay paused, a company written on the primary is missing from the
    brief; once replayed, it is there: the sources read the standby, not the primary."""
    org, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await seed.insert(admin, "organizations", id=org, name="Org")
    await seed.insert(admin, "crm_companies", organization_id=org, id=first, name="Replayed")
    await until_true(lambda: has_company(standby, first))
    await standby.execute("SELECT pg_wal_replay_pause()")
    await until_true(lambda: standby.fetchval("SELECT pg_get_wal_replay_pause_state() = 'paused'"))
    await seed.insert(admin, "crm_companies", organization_id=org, id=second, name="Not yet")
    await start_consumer(config.with_("database", read_url=read_url))

    paused = await build(config, "paused", org, first, second)
    assert f"[crm.company:{first}] name: Replayed" in paused
    assert "Not yet" not in paused

    await standby.execute("SELECT pg_wal_replay_resume()")
    await until_true(lambda: has_company(standby, second))
    resumed = await build(config, "resumed", org, first, second)
    assert f"[crm.company:{second}] name: Not yet" in resumed
    # another organization naming these companies reads nothing of them on the standby either
    other = uuid.uuid4()
    await seed.insert(admin, "organizations", id=other, name="Other")
    await until_true(lambda: has_organization(standby, other))
    foreign = await build(config, "foreign", other, first, second)
    assert "Replayed" not in foreign
    assert "Not yet" not in foreign


def lag_of(metrics: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("contextcore_database_replica_lag_seconds "):
            return float(line.split()[1])
    return None


async def test_the_standby_s_lag_is_a_metric(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    standby: asyncpg.Connection,
    read_url: str,
) -> None:
    """contextcore_database_replica_lag_seconds: near 0 while the standby keeps up; growing
    while its replay is paused and the primary writes; near 0 again once it has caught up."""
    port = free_port()
    await start_consumer(
        config.with_("database", read_url=read_url).with_(
            "build", metrics_port=port, replica_lag_interval_s=0.2
        )
    )
    url = f"http://127.0.0.1:{port}/metrics"

    async def lag() -> float | None:
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        return lag_of(body.decode())

    org = uuid.uuid4()
    await seed.insert(admin, "organizations", id=org, name="Org")
    await until_true(lambda: has_organization(standby, org))
    await until_true(lambda: below(lag(), 0.5))  # other tests' writes stream meanwhile
    await standby.execute("SELECT pg_wal_replay_pause()")
    await seed.insert(admin, "crm_companies", organization_id=org, id=uuid.uuid4(), name="Later")
    await until_true(lambda: above(lag(), 1.0))
    await standby.execute("SELECT pg_wal_replay_resume()")
    await until_true(lambda: below(lag(), 0.5))


async def has_organization(connection: asyncpg.Connection, org: uuid.UUID) -> bool:
    return bool(await connection.fetchval("SELECT count(*) FROM organizations WHERE id = $1", org))


async def below(value: Awaitable[float | None], bound: float) -> bool:
    found = await value
    return found is not None and found < bound


async def above(value: Awaitable[float | None], bound: float) -> bool:
    found = await value
    return found is not None and found > bound


async def delay_replay(standby: asyncpg.Connection, delay: str) -> None:
    """Set the standby's ``recovery_min_apply_delay`` (it applies each commit this long after
    the primary made it), and wait until the standby runs with it."""
    await standby.execute(f"ALTER SYSTEM SET recovery_min_apply_delay = '{delay}'")
    await standby.execute("SELECT pg_reload_conf()")
    wanted = await standby.fetchval(f"SELECT '{delay}'::interval")

    async def applied() -> bool:
        now = await standby.fetchval("SELECT current_setting('recovery_min_apply_delay')")
        return bool(await standby.fetchval("SELECT $1::text::interval = $2", now, wanted))

    await until_true(applied)


async def undelayed(standby: asyncpg.Connection) -> None:
    """The standby's ``recovery_min_apply_delay`` back to its default (none)."""
    await standby.execute("ALTER SYSTEM RESET recovery_min_apply_delay")
    await standby.execute("SELECT pg_reload_conf()")


async def replayed(standby: asyncpg.Connection, position: str | None) -> bool:
    assert position is not None
    query = "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn"
    return bool(await standby.fetchval(query, position))


def counted(metrics: str, database: str) -> float:
    """``contextcore_build_read_after_total{database=...}`` in a /metrics page."""
    prefix = f'contextcore_build_read_after_total{{database="{database}"}} '
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    raise AssertionError(f"no {prefix!r} in /metrics")


async def scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    return str(body.decode())


def options(config: Config, session: Session | None = None) -> ChannelOptions:
    """A client's options (``from_settings``'s); with ``session``, its answers' positions are
    the session's."""
    chosen = channel_options(config.kafka, config.topics)
    if session is not None:
        chosen["session"] = session
    return chosen


async def test_a_caller_reads_its_own_memory_writes_on_a_delayed_standby(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    standby: asyncpg.Connection,
    read_url: str,
) -> None:
    """The standby applies each commit ten minutes late. A caller whose clients share a session
    (its answers' positions) reads a forget and a remember it was just told of; a build without
    the position reads the standby's old state, the documented staleness. Once the
    standby has replayed the position, the same request reads the standby."""
    await ensure_topics(
        config.bootstrap, [*build_topics(config.topics), *memory_topics(config.topics)]
    )
    org = await seed.organization(admin)
    await until_true(lambda: has_organization(standby, org))
    port = free_port()
    await asyncio.gather(
        start_consumer(
            config.with_("database", read_url=read_url).with_("build", metrics_port=port)
        ),
        start_consumer(config, consumer="memory"),
    )
    principal = Invoker(organization_id=org, definition_id=uuid.uuid4(), user_id=uuid.uuid4())
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=org,
            user_id=principal.user_id,
            trigger_id=None,
            definition_id=principal.definition_id,
        ),
        query="how should I answer?",
        entities=(),
    )
    policy = ContextPolicy(
        total_token_budget=1_000, sources=[ContextSourceSpec(name="memory", token_budget=1_000)]
    )

    def memory(attribute: str, text: str) -> MemoryCandidate:
        return MemoryCandidate(scope="user", attribute=attribute, text=text)

    session = Session()
    async with (
        MemoryClient(
            memory_topic=config.topics.memory_write, **options(config, session)
        ) as memories,
        ContextClient(request_topic=config.request_topic, **options(config, session)) as ours,
        ContextClient(request_topic=config.request_topic, **options(config)) as anyone,
    ):
        kept = await memories.remember(principal, memory("preference.length", "Short answers"))
        assert kept.status == "written", kept
        assert kept.memory is not None
        await until_true(lambda: replayed(standby, kept.position))
        await delay_replay(standby, "10min")
        forgotten = await memories.forget(principal, kept.memory.id)
        learned = await memories.remember(principal, memory("preference.language", "In Welsh"))
        assert (forgotten.status, learned.status) == ("written", "written")
        assert session.position == learned.position

        stale = await anyone.build(request, policy, timeout=30)
        assert "Short answers" in stale.text
        assert "In Welsh" not in stale.text
        fresh = await ours.build(request, policy, timeout=30)
        assert "Short answers" not in fresh.text
        assert "In Welsh" in fresh.text
        assert counted(await scrape(port), "primary") == 1
        # a position the primary never wrote is none: the standby's state, counted ignored
        made_up = await anyone.build(request, policy, timeout=30, read_after="FFFFFFFF/0")
        assert made_up.text == stale.text
        assert counted(await scrape(port), "ignored") == 1

        await delay_replay(standby, "0")
        await until_true(lambda: replayed(standby, session.position))
        again = await ours.build(request, policy, timeout=30)
        assert again.text == fresh.text
        metrics = await scrape(port)
        assert (counted(metrics, "primary"), counted(metrics, "replica")) == (1, 1)


async def test_an_uploader_finds_its_ready_document_on_a_delayed_standby(
    config: Config,
    start_consumer: StartConsumer,
    admin: asyncpg.Connection,
    standby: asyncpg.Connection,
    read_url: str,
) -> None:
    """A document ready while the standby applies commits ten minutes late: the build naming the
    ready status's position finds it; one without reads the standby's state, which has no such
    document yet."""
    await ensure_topics(
        config.bootstrap, [*build_topics(config.topics), *upload_topics(config.topics)]
    )
    org = await seed.organization(admin)
    await until_true(lambda: has_organization(standby, org))
    await asyncio.gather(
        start_consumer(
            config.with_("database", read_url=read_url).with_("build", preload_encoder=True)
        ),
        start_consumer(config, consumer="upload"),
        start_consumer(config, consumer="embed"),
    )
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=org, user_id=None, trigger_id=None, definition_id=None
        ),
        query="can I get my money back after cancelling?",
        entities=(),
    )
    policy = ContextPolicy(
        total_token_budget=1_500,
        sources=[
            ContextSourceSpec(
                name="knowledge",
                token_budget=1_500,
                limit=8,
                options={"include_organization": True},
            )
        ],
    )
    session = Session()
    async with (
        KnowledgeClient(upload_topic=config.topics.upload, **options(config, session)) as knowledge,
        ContextClient(request_topic=config.request_topic, **options(config, session)) as ours,
        ContextClient(request_topic=config.request_topic, **options(config)) as anyone,
    ):
        await delay_replay(standby, "10min")
        ready = await knowledge.upload(
            organization_id=org,
            title="Handbook",
            media_type="text/markdown",
            uri="docs://handbook",
            content="# Handbook\n\n## Refunds\n\nA customer may cancel within 30 days of "
            "purchase and receive a full refund.",
            timeout=120,
        )
        assert ready.position is not None
        assert session.position == ready.position
        stale = await anyone.build(request, policy, timeout=30)
        assert "full refund" not in stale.text
        fresh = await ours.build(request, policy, timeout=30)
        assert "full refund" in fresh.text
