"""``contextcore_database_replica_lag_seconds``: how far behind its primary the database the
build's sources read is (``CONTEXTCORE_DATABASE_READ_URL``; 0 when they read the primary).

Measured on the read pool every ``replica_lag_interval_s`` (a scrape never waits for the
database): 0 on a primary, and on a standby that has replayed all the WAL it received;
otherwise the age of the last transaction it replayed. A primary with no writes leaves a
standby at 0, not at the age of its last write."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg
from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("contextcore.build")

REPLICA_LAG = """
-- replica.lag: seconds the database this session reads is behind its primary (0: a primary,
-- or a standby with nothing received left to replay)
SELECT CASE
    WHEN NOT pg_is_in_recovery() THEN 0
    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
    ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)
END::float8
"""


@contextlib.asynccontextmanager
async def watching_lag(
    pool: asyncpg.Pool, registry: CollectorRegistry, *, every_s: float
) -> AsyncIterator[Gauge]:
    """The gauge, refreshed from ``pool`` every ``every_s`` seconds while the block runs; a
    failed read leaves the last value (and is logged: the build's own reads say more)."""
    gauge = Gauge(
        "contextcore_database_replica_lag_seconds",
        "How far behind its primary the database the sources read is (0: the primary).",
        registry=registry,
    )

    async def refresh() -> None:
        while True:
            try:
                gauge.set(await pool.fetchval(REPLICA_LAG, timeout=min(every_s, 5.0)))
            except Exception as error:  # a monitor never ends: the database may come back
                log.warning("the read database's lag could not be read: %r", error)
            await asyncio.sleep(every_s)

    task = asyncio.create_task(refresh(), name="replica-lag")
    try:
        yield gauge
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
