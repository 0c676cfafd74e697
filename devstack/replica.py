"""A hot standby of the dev stack's PostgreSQL (issue 34): a base backup of the primary, then
streaming replication through a replication slot, on the same bundled binaries.

    contextcore dev up --replica

The standby listens on ``CONTEXTCORE_DEV_REPLICA_PORT`` (15433) with the primary's logins and
databases, read-only; its files live in ``<home>/replica``. Point the build consumer's source
reads at it with ``CONTEXTCORE_DATABASE_READ_URL`` (``up --replica`` prints the URL; ``env``
does not export it: a brief read there may lag the primary, docs/scaling.md).

The slot keeps on the primary the WAL the standby has not received yet, at most
``max_slot_wal_keep_size`` (the primary's start sets it), so a standby left stopped cannot
fill the disk: past that the slot is lost, and the next start makes a fresh base backup.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import asyncpg

from devstack.stack import DevStack, _port_open, _stale_lock, log_tail
from schemas.errors import InfrastructureUnavailable


def on_standby(url: str, port: int) -> str:
    """``url`` (a login on the primary) on the standby listening on ``port``: the same login
    and database, since the standby is a copy of the primary's whole cluster."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}").geturl()


SLOT = "contextcore_dev_replica"
"""The standby's replication slot on the primary (also its ``application_name`` there)."""

SLOT_STATE = """
-- replica.slot_state: the standby's slot on the primary, if any, and whether the WAL it needs
-- is still there ('lost' once max_slot_wal_keep_size was passed)
SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1
"""

DROP_SLOT = """
-- replica.drop_slot: before a fresh base backup makes it again
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = $1 AND NOT active
"""


class Replica:
    """The dev stack's standby: started, reused, rebuilt when its slot was lost, stopped."""

    def __init__(self, stack: DevStack) -> None:
        self.stack = stack
        self.port = stack.settings.replica_port
        self.data = stack.home / "replica" / "data"
        self.log = stack.home / "replica" / "postgres.log"

    def running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        status = self.stack._pg("pg_ctl", "status", "-D", str(self.data), check=False)
        return status.returncode == 0

    async def start(self) -> bool:
        """Start the standby unless it runs (the primary must); ``True`` when started now."""
        if await asyncio.to_thread(self.running):
            return False
        if _port_open(self.port):
            raise InfrastructureUnavailable(
                f"port 127.0.0.1:{self.port} is taken by a process that is not our standby; set "
                "CONTEXTCORE_DEV_REPLICA_PORT"
            )
        # a killed standby's lock files, as the primary's (DevStack.start_postgres)
        for lock in (
            self.data / "postmaster.pid",
            self.stack.pg_socket_dir / f".s.PGSQL.{self.port}.lock",
        ):
            if _stale_lock(lock):
                lock.unlink()
        admin = await asyncpg.connect(self.stack.addresses.admin_url)
        try:
            state = await admin.fetchval(SLOT_STATE, SLOT)
            if state in (None, "lost") or not (self.data / "PG_VERSION").exists():
                await admin.fetchval(DROP_SLOT, SLOT)
                await asyncio.to_thread(self._base_backup)
        finally:
            await admin.close()
        await asyncio.to_thread(self._pg_start)
        return True

    def stop(self) -> bool:
        """Stop the standby (``-m fast``); ``False`` when it was not up."""
        if not self.running():
            return False
        self.stack._pg("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))
        return True

    def _base_backup(self) -> None:
        """A fresh copy of the primary, with its slot, set to stream from it."""
        shutil.rmtree(self.data.parent, ignore_errors=True)
        self.data.parent.mkdir(parents=True)
        user = self.stack._pg_user()
        if user is not None:
            shutil.chown(self.data.parent, user)
        password = self.stack._credentials()["postgres"]
        primary = f"host=127.0.0.1 port={self.stack.settings.pg_port} user=postgres"
        try:
            self._base_backup_of(primary, password)
        except subprocess.CalledProcessError as error:
            raise InfrastructureUnavailable(
                f"the base backup of the primary failed: {error.stderr.strip() or error}"
            ) from error
        # the connection it streams through, written whole (not trusting -R with the password)
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = '{primary} password={password} application_name={SLOT}'\n"
                f"primary_slot_name = '{SLOT}'\n"
            )

    def _base_backup_of(self, primary: str, password: str) -> None:
        self.stack._pg(
            "pg_basebackup",
            "--pgdata",
            str(self.data),
            "--dbname",
            primary,
            "--wal-method=stream",
            "--create-slot",
            "--slot",
            SLOT,
            "--write-recovery-conf",
            "--checkpoint=fast",
            "--no-sync",
            env={"PGPASSWORD": password},
        )

    def _pg_start(self) -> None:
        started = time.monotonic()
        try:
            self.stack._pg(
                "pg_ctl",
                "start",
                "-w",
                "-t",
                str(int(self.stack.settings.start_timeout_s)),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                f"-h 127.0.0.1 -p {self.port} -k {self.stack.pg_socket_dir} -c fsync=off"
                " -c shared_buffers=128MB -c hot_standby=on -c hot_standby_feedback=on"
                # a hot standby needs at least the primary's (DevStack.start_postgres)
                " -c max_connections=300",
            )
        except subprocess.CalledProcessError as error:
            raise InfrastructureUnavailable(
                f"the standby did not start in {time.monotonic() - started:.0f} s: "
                f"{error.stderr.strip() or error}; {self.log} ends:\n{log_tail(self.log)}"
            ) from error
