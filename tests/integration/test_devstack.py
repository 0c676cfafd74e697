"""The embedded stack itself, in a home and on ports of its own (the shared one keeps running)."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from broker.topics import TopicSpec
from devstack.stack import DevSettings, DevStack
from tests.integration.helpers import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
async def stack() -> AsyncIterator[DevStack]:
    # Under /var/tmp: as root, the unprivileged postgres user must traverse to the data folder.
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="cc-devstack-") as home:
        os.chmod(home, 0o755)
        own = DevStack(DevSettings(home=Path(home), kafka_port=free_port(), pg_port=free_port()))
        yield own
        await asyncio.to_thread(own.down)  # whatever the test left running


@pytest.mark.timeout(120)
async def test_up_reuses_recovers_from_a_killed_postgres_and_stops(stack: DevStack) -> None:
    topics = [TopicSpec("devstack.test", 2)]
    first = await stack.up(topics)
    assert (first.broker_started, first.postgres_started) == (True, True)
    assert first.topics_created == ["devstack.test"]
    again = await stack.up(topics)
    assert (again.broker_started, again.postgres_started, again.topics_created) == (
        False,
        False,
        [],
    )

    # A crashed server leaves its lock files behind; the next `up` must start anyway.
    postmaster = int((stack.pg_data / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    recovered = await stack.up(topics)
    assert recovered.postgres_started
    addresses = recovered.addresses
    conn = await asyncpg.connect(addresses.database_url)
    try:
        assert await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        login = await conn.fetchrow(
            "SELECT rolname, rolsuper, rolinherit FROM pg_roles WHERE rolname = current_user"
        )
        assert login is not None
        assert tuple(login) == ("contextcore_runtime", False, False)
    finally:
        await conn.close()
    # two credentials: every TCP login needs its password
    port = stack.settings.pg_port
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://postgres:wrong@127.0.0.1:{port}/postgres")
    owner = await asyncpg.connect(addresses.owner_url)
    await owner.close()

    assert await asyncio.to_thread(stack.down) == (True, True)
    assert stack.status() == (False, False)
