"""Real services for the tests: the Tansu broker and PostgreSQL 18 + pgvector (fixtures, a plugin
of tests/conftest.py: the integration tier and the behaviour suites' broker runs use them).

When ``CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS`` and ``CONTEXTCORE_DATABASE_ADMIN_URL`` (a superuser
of a pgvector PostgreSQL) are both set, the tests use those services; otherwise the session
starts the embedded stack (``DevStack``), which the run stops at its end if it started it
(tests/conftest.py: the workers of ``pytest -n N`` share one). Nothing here is mocked.

Credentials as in production (docs/tenancy.md): the session provisions a schema owner and a
runtime login of its own; migrations run as the owner, services and the tenancy layer as the
runtime login, and rows are seeded by the administrator (the application that owns them).

Isolation: each test gets its own topics and consumer group (``config``) and its own database
cloned from a migrated template; each session (each xdist worker) its own roles and template.
That is what lets scripts/test run the tests on several workers at once (and why a test that
looks at the whole cluster, ``pg_stat_activity`` say, keeps to its own database).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import secrets
import signal
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar
from urllib.parse import quote, urlsplit

import asyncpg
import pytest

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import all_topics, build_topics, ensure_topics
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.sweep.app import SweepSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.encoding import Encoder
from contextcore.storage import migrations
from contextcore.storage.pool import create_pool, with_database
from contextcore.storage.provision import Login, provision_database, provision_roles
from contextcore.storage.settings import DatabaseSettings, environ
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS, DevStack
from producers.knowledge import KnowledgeClient
from tests.conftest import RUN, STARTED


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    admin_url: str  # a superuser, on the maintenance database


@dataclass(frozen=True)
class Roles:
    owner: Login
    runtime: Login


@dataclass(frozen=True)
class Database:
    """One test database and the three ways in."""

    name: str
    admin_url: str  # superuser: seeding and catalog checks
    owner_url: str  # the schema owner: migrations
    url: str  # the runtime login: what services use


def login_url(admin_url: str, login: Login, database: str) -> str:
    """A URL of the administrator's server for ``login`` on ``database``."""
    parts = urlsplit(admin_url)
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    secret = f":{quote(login.password, safe='')}" if login.password else ""
    netloc = f"{quote(login.user, safe='')}{secret}@{host}{port}"
    return parts._replace(netloc=netloc, path="/" + quote(database)).geturl()


@contextlib.asynccontextmanager
async def _exclusive(path: Path) -> AsyncIterator[None]:
    """Held by one process at a time: the workers of `pytest -n N` take turns."""
    with path.open("w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
async def services() -> Services:
    bootstrap = os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS")
    admin = os.environ.get("CONTEXTCORE_DATABASE_ADMIN_URL")
    if not (bootstrap and admin):
        stack = DevStack()
        # Under `pytest -n N` each worker runs this fixture: the first one to hold the lock
        # starts the stack, the others find it running. The run's controller stops it at the
        # end when this run started it (tests/conftest.py).
        stack.home.mkdir(parents=True, exist_ok=True)
        async with _exclusive(stack.home / "pytest.lock"):
            report = await stack.up(all_topics(TopicSettings()))
            if report.broker_started or report.postgres_started:
                (stack.home / STARTED).write_text(os.environ.get(RUN, ""))
        bootstrap, admin = report.addresses.bootstrap_servers, report.addresses.admin_url
    return Services(bootstrap, admin)


@pytest.fixture(scope="session")
async def roles(services: Services) -> AsyncIterator[Roles]:
    """This session's owner and runtime login. Roles are cluster-wide: each session makes its
    own (two sessions on one cluster would otherwise reset each other's passwords), and drops
    them when its databases are gone."""
    tag = f"{os.getpid()}_{secrets.token_hex(3)}"
    owner = Login(f"cc_test_owner_{tag}", secrets.token_urlsafe(12), "")
    runtime = Login(f"cc_test_runtime_{tag}", secrets.token_urlsafe(12), "")
    # the workers of one run create the roles they share (the service role) once: one at a time
    async with _exclusive(Path(tempfile.gettempdir()) / "contextcore-pytest-roles.lock"):
        conn = await asyncpg.connect(services.admin_url)
        try:
            await provision_roles(conn, owner=owner, runtime=runtime)
        finally:
            await conn.close()
    yield Roles(owner, runtime)
    conn = await asyncpg.connect(services.admin_url)
    try:
        for login in (runtime, owner):
            with contextlib.suppress(asyncpg.PostgresError):  # a database a test left behind
                await conn.execute(f'DROP ROLE IF EXISTS "{login.user}"')
    finally:
        await conn.close()


async def _admin_execute(services: Services, sql: str) -> None:
    conn = await asyncpg.connect(services.admin_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _database(
    services: Services, roles: Roles, name: str, *, template: str | None = None
) -> Database:
    if template is not None:
        await _admin_execute(
            services, f'CREATE DATABASE "{name}" TEMPLATE "{template}" OWNER "{roles.owner.user}"'
        )
    await provision_database(services.admin_url, name, owner=roles.owner.user)
    return Database(
        name=name,
        admin_url=with_database(services.admin_url, name),
        owner_url=login_url(services.admin_url, roles.owner, name),
        url=login_url(services.admin_url, roles.runtime, name),
    )


async def _drop(services: Services, name: str) -> None:
    await _admin_execute(services, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
async def template_database(services: Services, roles: Roles) -> AsyncIterator[str]:
    """A database with every migration applied by the owner; each test clones it."""
    name = f"cc_template_{os.getpid()}"
    await _drop(services, name)
    database = await _database(services, roles, name)
    conn = await asyncpg.connect(database.owner_url)
    try:
        await migrations.apply_pending(conn)
    finally:
        await conn.close()
    yield name
    await _drop(services, name)


@pytest.fixture
async def database(
    services: Services, roles: Roles, template_database: str
) -> AsyncIterator[Database]:
    """A fresh, fully migrated database of this test's own."""
    name = f"cc_test_{uuid.uuid4().hex[:16]}"
    yield await _database(services, roles, name, template=template_database)
    await _drop(services, name)


@pytest.fixture
async def database_url(database: Database) -> str:
    """This test's database as the runtime login."""
    return database.url


@pytest.fixture
async def second_database(
    services: Services, roles: Roles, template_database: str
) -> AsyncIterator[Database]:
    """Another fully migrated database (a stand-in read replica with rows of its own)."""
    name = f"cc_test_{uuid.uuid4().hex[:16]}"
    yield await _database(services, roles, name, template=template_database)
    await _drop(services, name)


@pytest.fixture
async def empty_database(services: Services, roles: Roles) -> AsyncIterator[Database]:
    """A provisioned database (owner, pgvector) with no migration applied."""
    name = f"cc_test_{uuid.uuid4().hex[:16]}"
    yield await _database(services, roles, name)
    await _drop(services, name)


@pytest.fixture
async def admin(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection to this test's database: how the application writes its rows."""
    conn = await asyncpg.connect(database.admin_url)
    yield conn
    await conn.close()


@pytest.fixture
async def tenant_db(database: Database) -> AsyncIterator[TenantDatabase]:
    """The tenancy layer over a small pool of the runtime login, the service role for the
    whole session as in a consumer (scoped reads are one statement)."""
    pool = await create_pool(database.url, min_size=1, max_size=3, session_role=SERVICE_ROLE)
    yield TenantDatabase(pool)
    await pool.close()


@dataclass(frozen=True)
class Config:
    """Everything a consumer process of this test reads from its environment."""

    kafka: KafkaSettings
    topics: TopicSettings
    build: BuildSettings
    database: DatabaseSettings
    upload: UploadSettings
    embed: EmbedSettings
    knowledge: KnowledgeSettings
    memory: MemorySettings
    sweep: SweepSettings

    @property
    def bootstrap(self) -> str:
        return self.kafka.require_bootstrap_servers()

    @property
    def request_topic(self) -> str:
        return self.topics.build_request

    def reply_topic(self, name: str) -> str:
        return f"{self.topics.reply_prefix}.{name}"

    def knowledge_client(self) -> KnowledgeClient:
        """A client of this test's upload topic (use as ``async with``)."""
        return KnowledgeClient(
            bootstrap_servers=self.bootstrap,
            upload_topic=self.topics.upload,
            reply_topic_prefix=self.topics.reply_prefix,
            fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
        )

    def with_(self, section: str, **changes: Any) -> Config:
        """A copy with ``changes`` to one settings group (``kafka``, ``build``, …)."""
        group = getattr(self, section).model_copy(update=changes)
        return dataclasses.replace(self, **{section: group})

    def environ(self) -> dict[str, str]:
        """The child's environment: ours without any CONTEXTCORE_* setting, then these."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")}
        return {
            **inherited,
            **environ(
                self.kafka,
                self.topics,
                self.build,
                self.database,
                self.upload,
                self.embed,
                self.knowledge,
                self.memory,
                self.sweep,
            ),
        }


@pytest.fixture
async def config(services: Services, database: Database, model_cache: Path) -> Config:
    """Settings naming this test's own topics, group and database (as the runtime login)."""
    tag = uuid.uuid4().hex[:12]
    config = Config(
        # model_construct: the defaults and these values, never this process's environment
        kafka=KafkaSettings.model_construct(
            bootstrap_servers=services.bootstrap_servers, fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS
        ),
        topics=TopicSettings.model_construct(
            build_request=f"test.{tag}.build-request",
            build_request_partitions=4,
            reply_prefix=f"test.{tag}.reply",
            upload=f"test.{tag}.upload",
            upload_partitions=2,
            embed=f"test.{tag}.embed",
            embed_partitions=4,
            memory_write=f"test.{tag}.memory-write",
            memory_write_partitions=2,
        ),
        # the knowledge tests turn the encoder's preload on; the others spare its seconds
        build=BuildSettings.model_construct(
            group_id=f"test-{tag}-build", metrics_port=0, preload_encoder=False
        ),
        database=DatabaseSettings.model_construct(url=database.url),
        # normal priority: the suite's workers load the machine, and batch consumers at nice 10
        # beside them slowed the knowledge tests to their timeouts; the priority has a test
        upload=UploadSettings.model_construct(
            group_id=f"test-{tag}-upload", metrics_port=0, nice=0, cpu_policy="normal"
        ),
        embed=EmbedSettings.model_construct(
            group_id=f"test-{tag}-embed", metrics_port=0, nice=0, cpu_policy="normal"
        ),
        knowledge=KnowledgeSettings.model_construct(cache_dir=model_cache),
        memory=MemorySettings.model_construct(group_id=f"test-{tag}-memory", metrics_port=0),
        sweep=SweepSettings.model_construct(metrics_port=0),
    )
    await ensure_topics(services.bootstrap_servers, build_topics(config.topics))
    return config


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export cache per session: the OpenVINO export runs once, not once per consumer."""
    return tmp_path_factory.mktemp("models")


async def spawn_build_consumer(
    config: Config,
    *,
    stderr: int | IO[bytes] = asyncio.subprocess.PIPE,
    consumer: str = "build",
) -> asyncio.subprocess.Process:
    """``contextcore serve <consumer>`` as its own process, configured by ``config`` only."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumers.cli",
        "serve",
        consumer,
        env=config.environ(),
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


class ConsumerProcess:
    """A real ``contextcore serve build`` process, as an operator would run it."""

    READY: ClassVar[dict[str, str]] = {"sweep": "sweep ready"}
    """How a process that is no record consumer says it is ready; the others say
    ``<name> consumer ready``."""

    def __init__(
        self, process: asyncio.subprocess.Process, log_path: Path, consumer: str = "build"
    ) -> None:
        self.process = process
        self.log_path = log_path
        self.consumer = consumer

    async def wait_ready(self, timeout: float = 240.0) -> None:
        """Until the process says it is ready, or exits (at once). The bound is generous: an
        embedding consumer loads its model first, which takes minutes on a busy machine."""
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise AssertionError(
                        f"consumer exited ({await self.process.wait()}): "
                        f"{self.log_path.read_text()[-2000:]}"
                    )
                ready = self.READY.get(self.consumer, f"{self.consumer} consumer ready")
                if line.startswith(ready.encode()):
                    return

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.returncode is None:
            self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), 30)


StartConsumer = Callable[..., Awaitable[ConsumerProcess]]


@pytest.fixture
async def start_consumer(tmp_path: Path) -> AsyncIterator[StartConsumer]:
    started: list[ConsumerProcess] = []

    async def start(
        config: Config, *, ready: bool = True, consumer: str = "build"
    ) -> ConsumerProcess:
        log_path = tmp_path / f"consumer-{len(started)}-{consumer}.log"
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            process = await spawn_build_consumer(config, stderr=log, consumer=consumer)
        handle = ConsumerProcess(process, log_path, consumer)
        started.append(handle)
        if ready:
            await handle.wait_ready()
        return handle

    yield start
    for handle in started:
        await handle.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def encoder(model_cache: Path) -> Encoder:
    """The default model on its default backend, in this process (the knowledge source's)."""
    return KnowledgeSettings.model_construct(cache_dir=model_cache).load_encoder()
