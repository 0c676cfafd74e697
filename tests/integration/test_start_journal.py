"""The start journal on real PostgreSQL, as the runtime login (issue 17): starts counted across
"processes", group commit under concurrency, solo starts taken back, committed rows forgotten,
old rows pruned by the sweep beside the ledger's expired claims, and failing open; a row counts
only for the digest of the record it was counted for (issue 32; tests/integration/
test_journal_planting.py plants rows the way an attacker would)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from consumers.knowledge.sweep.app import Sweeper, SweepSettings
from consumers.knowledge.sweep.postgres import PostgresSweepStore
from consumers.runtime.journal import PostgresJournal, Prior, Start, record_digest
from contextcore.storage.pool import create_pool
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import SERVICE_ROLE
from tests.integration.helpers import free_port, until_true
from tests.services import Database

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool(database: Database) -> AsyncIterator[asyncpg.Pool]:
    """The runtime's journal pool: the runtime login, the service role for each session."""
    pool = await create_pool(database.url, min_size=1, max_size=2, session_role=SERVICE_ROLE)
    yield pool
    await pool.close()


def at(offset: int, partition: int = 0, topic: str = "t", *, value: bytes = b"{}") -> Start:
    """The start of a record of ``value`` at this position."""
    return Start(topic, partition, offset, record_digest(None, value))


async def test_starts_are_counted_across_processes_and_forgotten_once_committed(
    pool: asyncpg.Pool, admin: asyncpg.Connection
) -> None:
    first = PostgresJournal(pool, group="g")
    assert await first.started(at(7)) == Prior(0, 0)
    again = PostgresJournal(pool, group="g")  # a restarted process: the count survived
    assert await again.started(at(7)) == Prior(1, 0)
    assert (await again.started(at(7))).suspect
    other_group = PostgresJournal(pool, group="h")
    assert await other_group.started(at(7)) == Prior(0, 0)  # groups count apart
    await again.solo_started(at(7))
    await again.solo_started(at(7))
    await again.solo_finished(at(7))
    assert await again.started(at(7)) == Prior(3, 1)  # one solo start never finished
    await again.started(at(9))
    await again.forget({("t", 0): 8})  # committed up to 8: 7 goes, 9 stays
    await again.flush()
    rows = await admin.fetch(
        'SELECT consumer_group, "offset" FROM delivery_starts ORDER BY consumer_group, "offset"'
    )
    assert [tuple(r) for r in rows] == [("g", 9), ("h", 7)]
    await again.close()


async def test_a_row_counts_only_for_the_record_it_was_counted_for(
    pool: asyncpg.Pool, admin: asyncpg.Connection
) -> None:
    """Another record's bytes at the same position (a row planted before the record existed, a
    topic made again) start the count afresh; its solo starts change nothing of the row."""
    journal = PostgresJournal(pool, group="g")
    mine, other = at(7), at(7, value=b"other")
    assert await journal.started(mine) == Prior(0, 0)
    await journal.solo_started(mine)
    assert await journal.started(mine) == Prior(1, 1)
    await journal.solo_started(other)  # not its row: nothing changes
    assert await journal.started(mine) == Prior(2, 1)
    await journal.solo_finished(other)
    await journal.solo_finished(other)
    assert await journal.started(mine) == Prior(3, 1)
    assert await journal.started(other) == Prior(0, 0)  # the row is the other's now
    await journal.solo_started(mine)  # ... so this changes nothing either
    assert await journal.started(other) == Prior(1, 0)
    assert await journal.started(mine) == Prior(0, 0)
    row = await admin.fetchrow("SELECT starts, solo_starts, digest FROM delivery_starts")
    assert row is not None
    assert tuple(row) == (1, 0, mine.digest)
    await journal.close()


async def test_commits_are_forgotten_together_after_the_delay_and_on_close(
    pool: asyncpg.Pool, admin: asyncpg.Connection
) -> None:
    async def left() -> list[tuple[int, int]]:
        rows = await admin.fetch('SELECT "partition", "offset" FROM delivery_starts')
        return sorted((r["partition"], r["offset"]) for r in rows)

    waiting = PostgresJournal(pool, group="g", forget_delay_s=3600)
    for offset in range(6):
        await waiting.started(at(offset))
        await waiting.started(at(offset, partition=1))
    await waiting.forget({("t", 0): 2})
    await waiting.forget({("t", 0): 4, ("t", 1): 1})
    await waiting.forget({("t", 0): 3})  # an older commit never undoes a newer one
    assert len(await left()) == 12  # nothing deleted before the delay
    await waiting.close()  # a stopping member writes what waits, without the delay
    assert await left() == [(0, 4), (0, 5)] + [(1, o) for o in range(1, 6)]

    prompt = PostgresJournal(pool, group="g", forget_delay_s=0.05)
    await prompt.forget({("t", 1): 6})

    async def forgotten() -> bool:
        return await left() == [(0, 4), (0, 5)]

    await until_true(forgotten)
    await prompt.close()


async def test_a_journal_on_a_pool_without_the_service_role_counts_nothing(
    database: Database, admin: asyncpg.Connection
) -> None:
    """The runtime login itself may not write the journal (it owns nothing, holds no grant):
    the pool's session role is what lets a start be one statement."""
    pool = await create_pool(database.url, min_size=1, max_size=1)
    try:
        journal = PostgresJournal(pool, group="g", timeout_s=5.0)
        assert await journal.started(at(1)) == Prior()
        assert not journal.available  # failed open, and said so
    finally:
        await pool.close()
    assert await admin.fetchval("SELECT count(*) FROM delivery_starts") == 0


async def test_concurrent_starts_share_one_statement_and_each_is_counted(
    pool: asyncpg.Pool, admin: asyncpg.Connection
) -> None:
    journal = PostgresJournal(pool, group="g")
    positions = [at(offset, partition, topic) for topic in ("a", "b") for partition in range(3)
                 for offset in range(20)]  # fmt: skip
    priors = await asyncio.gather(*(journal.started(p) for p in positions))
    assert set(priors) == {Prior(0, 0)}
    priors = await asyncio.gather(*(journal.started(p) for p in positions))
    assert set(priors) == {Prior(1, 0)}
    assert await admin.fetchval("SELECT count(*) FROM delivery_starts") == len(positions)
    assert await admin.fetchval("SELECT sum(starts) FROM delivery_starts") == 2 * len(positions)


async def test_the_journal_fails_open_when_the_database_does_not_answer(
    database: Database,
) -> None:
    unreachable = database.url.replace(":15432/", f":{free_port()}/")
    assert unreachable != database.url
    pool = await asyncpg.create_pool(unreachable, min_size=0, max_size=1)
    assert pool is not None
    try:
        journal = PostgresJournal(pool, group="g", timeout_s=1.0)
        assert await journal.started(at(1)) == Prior()  # started uncounted, not stopped
        assert not journal.available
        assert not await journal.check()
    finally:
        await pool.close()


async def test_the_sweep_prunes_old_journal_rows_and_expired_ledger_claims(
    pool: asyncpg.Pool, admin: asyncpg.Connection, database: Database
) -> None:
    journal = PostgresJournal(pool, group="g")
    for offset in range(5):
        await journal.started(at(offset))
    await admin.execute(
        "UPDATE delivery_starts SET last_started_at = now() - interval '8 days'"
        ' WHERE "offset" < 3'
    )
    await admin.execute(
        "INSERT INTO processed_messages (organization_id, consumer, message_id, processed_at)"
        " VALUES (NULL, 'upload', 'old', now() - interval '8 days'),"
        " (NULL, 'upload', 'young', now() - interval '2 days')"
    )
    sweeper = Sweeper(
        SweepSettings(metrics_port=0, prune_batch=2),  # several batches
        PostgresSweepStore(DatabaseSettings.model_construct(url=database.url)),
        publisher=None,  # type: ignore[arg-type]  # nothing pending: nobody is told anything
    )
    await sweeper.sweep_once()
    offsets = await admin.fetch('SELECT "offset" FROM delivery_starts ORDER BY "offset"')
    assert [r["offset"] for r in offsets] == [3, 4]
    claims = await admin.fetch("SELECT message_id FROM processed_messages")
    assert [r["message_id"] for r in claims] == ["young"]
