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

from consumers.devstack import DevSettings, DevStack
from consumers.topics import TopicSpec
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
    conn = await asyncpg.connect(recovered.addresses.database_url)
    try:
        assert await conn.fetchval(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        )
    finally:
        await conn.close()

    assert await asyncio.to_thread(stack.down) == (True, True)
    assert stack.status() == (False, False)
