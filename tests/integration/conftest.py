"""Real services for the integration tier: the Tansu broker and PostgreSQL 18 + pgvector.

When ``CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS`` and ``CONTEXTCORE_DATABASE_URL`` are both set, the
tests use those services; otherwise the session starts the embedded stack (``DevStack``), and
stops it at the end if it started it. Nothing here is mocked.

Isolation: each test gets its own topics and consumer group (``kafka_settings``) and its own
database cloned from a migrated template (``database_url``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import asyncpg
import pytest

from consumers.devstack import DevStack
from consumers.topics import all_topics, build_topics, ensure_topics
from contextcore.settings import Settings
from contextcore.storage import migrations
from contextcore.storage.tenancy import TenantDatabase

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    database_url: str  # the maintenance database; tests get their own (database_url fixture)


@pytest.fixture(scope="session")
async def services() -> AsyncIterator[Services]:
    bootstrap = os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS")
    database = os.environ.get("CONTEXTCORE_DATABASE_URL")
    stack: DevStack | None = None
    if not (bootstrap and database):
        stack = DevStack()
        report = await stack.up(all_topics(Settings()))
        bootstrap, database = report.addresses.bootstrap_servers, report.addresses.database_url
        if not (report.broker_started or report.postgres_started):
            stack = None  # somebody else's stack: leave it running
    yield Services(bootstrap, database)
    if stack is not None and not os.environ.get("CONTEXTCORE_DEV_KEEP"):
        await asyncio.to_thread(stack.down)


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
async def template_database(services: Services) -> AsyncIterator[str]:
    """A database with every migration applied; each test clones it."""
    name = f"cc_template_{os.getpid()}"
    conn = await asyncpg.connect(services.database_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    migrated = await asyncpg.connect(_with_database(services.database_url, name))
    try:
        await migrations.apply_pending(migrated)
    finally:
        await migrated.close()
    yield name
    conn = await asyncpg.connect(services.database_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _new_database(services: Services, template: str | None) -> str:
    name = f"cc_test_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(services.database_url)
    try:
        source = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{source}')
    finally:
        await conn.close()
    return name


async def _drop_database(services: Services, name: str) -> None:
    conn = await asyncpg.connect(services.database_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def database_url(services: Services, template_database: str) -> AsyncIterator[str]:
    """A fresh, fully migrated database of this test's own."""
    name = await _new_database(services, template_database)
    yield _with_database(services.database_url, name)
    await _drop_database(services, name)


@pytest.fixture
async def second_database_url(services: Services, template_database: str) -> AsyncIterator[str]:
    """Another fully migrated database (a stand-in read replica with rows of its own)."""
    name = await _new_database(services, template_database)
    yield _with_database(services.database_url, name)
    await _drop_database(services, name)


@pytest.fixture
async def empty_database_url(services: Services) -> AsyncIterator[str]:
    """A fresh database with no migration applied."""
    name = await _new_database(services, None)
    yield _with_database(services.database_url, name)
    await _drop_database(services, name)


@pytest.fixture
async def owner(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the table owner: how an admin or a sync job writes rows."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
async def tenant_db(database_url: str) -> AsyncIterator[TenantDatabase]:
    """The tenancy layer over a small pool of this test's database."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    assert pool is not None
    yield TenantDatabase(pool)
    await pool.close()


@pytest.fixture
async def kafka_settings(services: Services, database_url: str) -> Settings:
    """Settings naming this test's own topics, group and database."""
    tag = uuid.uuid4().hex[:12]
    settings = Settings(
        kafka_bootstrap_servers=services.bootstrap_servers,
        database_url=database_url,
        topic_build_request=f"test.{tag}.build-request",
        build_group_id=f"test-{tag}-build",
        reply_topic_prefix=f"test.{tag}.reply",
        metrics_port=0,
    )
    await ensure_topics(services.bootstrap_servers, build_topics(settings))
    return settings


def settings_env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings.environ()}


async def spawn_build_consumer(
    settings: Settings, *, stderr: int | IO[bytes] = asyncio.subprocess.PIPE
) -> asyncio.subprocess.Process:
    """``contextcore serve build`` as its own process, configured by ``settings`` only."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumers.cli",
        "serve",
        "build",
        env=settings_env(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


class ConsumerProcess:
    """A real ``contextcore serve build`` process, as an operator would run it."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    async def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise AssertionError(
                        f"consumer exited ({await self.process.wait()}): "
                        f"{self.log_path.read_text()[-2000:]}"
                    )
                if line.startswith(b"build consumer ready"):
                    return

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.returncode is None:
            self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), 30)


StartConsumer = Callable[..., Awaitable[ConsumerProcess]]


@pytest.fixture
async def start_consumer(tmp_path: Path) -> AsyncIterator[StartConsumer]:
    started: list[ConsumerProcess] = []

    async def start(settings: Settings, *, ready: bool = True) -> ConsumerProcess:
        log_path = tmp_path / f"consumer-{len(started)}.log"
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            process = await spawn_build_consumer(settings, stderr=log)
        handle = ConsumerProcess(process, log_path)
        started.append(handle)
        if ready:
            await handle.wait_ready()
        return handle

    yield start
    for handle in started:
        await handle.stop(signal.SIGKILL)
