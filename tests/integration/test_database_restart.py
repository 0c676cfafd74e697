"""PostgreSQL stopped for 10 s in the middle of builds, memory writes, uploads and embeddings
(issue 17): every consumer keeps its process, says not ready while the database is gone, waits
and tries again in place (no attempt spent, no dead letter), and finishes: nothing lost, nothing
half written.

The test runs a PostgreSQL of its own (the embedded one, on a free port), so stopping it
disturbs no other test; the broker is the shared one.
"""

from __future__ import annotations

import asyncio
import shutil
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from contextcore.storage import migrations
from contextcore.storage.pool import with_database
from devstack.stack import DevSettings, DevStack, StackAddresses
from tests.integration.helpers import free_port, until, until_true
from tests.integration.load import ORG, MixedLoad, follow_load
from tests.integration.test_crash_loop import Reader
from tests.services import Config, ConsumerProcess, StartConsumer

pytestmark = pytest.mark.integration

CONSUMERS = ("build", "memory", "upload", "embed")
OUTAGE_S = 10.0
READS_THE_DATABASE = {  # a build whose sources read PostgreSQL: they fail while it is gone
    "total_token_budget": 600,
    "sources": [
        {"name": "memory", "token_budget": 300},
        {"name": "dossier", "token_budget": 300},
    ],
}


@dataclass
class Private:
    stack: DevStack
    addresses: StackAddresses

    @property
    def admin_url(self) -> str:
        return with_database(self.addresses.admin_url, "contextcore")

    async def stop(self) -> None:
        await asyncio.to_thread(self.stack.stop_postgres)

    async def start(self) -> None:
        await asyncio.to_thread(self.stack.start_postgres)


@pytest.fixture
async def private() -> AsyncIterator[Private]:
    """A PostgreSQL of this test's own, provisioned and migrated. Its home is under /var/tmp:
    the unprivileged user that runs it as root must reach it (pytest's tmp folders are 0700)."""
    home = Path(f"/var/tmp/cc-test-pg-{uuid.uuid4().hex[:8]}")
    stack = DevStack(DevSettings(home=home, pg_port=free_port(), kafka_port=free_port()))
    await asyncio.to_thread(stack.start_postgres)
    try:
        await stack.ensure_database()
        addresses = stack.addresses
        conn = await asyncpg.connect(addresses.owner_url)
        try:
            await migrations.apply_pending(conn)
        finally:
            await conn.close()
        yield Private(stack, addresses)
    finally:
        await asyncio.to_thread(stack.stop_postgres)
        shutil.rmtree(home, ignore_errors=True)


def ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


async def all_ready(ports: dict[str, int], status: int) -> bool:
    """Whether every consumer's ``/readyz`` answers ``status``."""
    seen = [await asyncio.to_thread(ready, port) for port in ports.values()]
    return set(seen) == {status}


@pytest.mark.timeout(600)
async def test_consumers_wait_out_a_database_restart_and_lose_nothing(
    config: Config, start_consumer: StartConsumer, private: Private
) -> None:
    admin = await asyncpg.connect(private.admin_url)
    try:
        await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'Restart')", ORG)
    finally:
        await admin.close()
    ports = {name: free_port() for name in CONSUMERS}
    config = config.with_("database", url=private.addresses.database_url)
    for name in CONSUMERS:
        config = config.with_(name, metrics_port=ports[name])
    reader = Reader()
    reply_to, letters = await follow_load(config, reader, "restart")
    processes: list[ConsumerProcess] = list(
        await asyncio.gather(*(start_consumer(config, consumer=name) for name in CONSUMERS))
    )
    load = MixedLoad(config, reply_to, policy=READS_THE_DATABASE)
    stop = asyncio.Event()
    replies = reader.records[reply_to]
    try:
        running = asyncio.create_task(load.run(stop.is_set))
        await until(lambda: len(load.uploads) >= 2, timeout=60)
        await private.stop()
        await until_true(lambda: all_ready(ports, 503), timeout=60)
        await asyncio.sleep(OUTAGE_S)  # the load goes on against a database that is gone
        await private.start()
        await until_true(lambda: all_ready(ports, 200), timeout=60)
        await asyncio.sleep(3)  # some load after the restart too
        stop.set()
        await running

        await until(lambda: load.answered(replies), timeout=240)
        assert [p.process.returncode for p in processes] == [None] * len(CONSUMERS)
    finally:
        await reader.close()
    briefs = [r for r in replies if r["correlation_id"] in set(load.builds)]
    unavailable = [r for r in briefs if r["brief"] and r["brief"]["failed_sources"]]
    print(
        f"database restart: {len(load.builds)} builds ({len(unavailable)} answered with failed"
        f" sources while the database was gone), {len(load.writes)} memory writes,"
        f" {len(load.uploads)} uploads"
    )
    assert not any(reader.records[topic] for topic in letters), "nothing is dead-lettered"
    admin = await asyncpg.connect(private.admin_url)
    try:
        await load.assert_settled_truth(admin, replies)
    finally:
        await admin.close()
    waits = sum("waits for the database" in p.log() for p in processes if p.consumer != "build")
    assert waits >= 1, "no consumer waited: the outage missed the load"
