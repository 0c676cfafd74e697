"""Read-your-writes across a replica: the primary's log position a write is answered with, and
whether a replica has replayed up to a position (docs/scaling.md).

A position taken **after** a write's commit returned lies past the commit's record, so a
standby whose replay has reached it has applied the commit, and any snapshot it takes from
then on sees the write. Taken inside the transaction it would not: the commit's record comes
after. It is the *insert* position, not the flushed one: with ``synchronous_commit`` off a
commit returns before its record is flushed, and a flushed position could lie before it. (The
price: right after a record that ends on a page boundary, the insert position is past the next
page's header, which a standby reaches only with the next record; until then such a build
reads the primary.) Every function here is open to every login (no privilege to grant).

Both are best effort with a bound on the whole call, the wait for a pool's connection
included: a position is an optimisation of where to read, never a reason to fail an answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from schemas.position import position_value

log = logging.getLogger("contextcore.positions")

WritePosition = Callable[[], Awaitable[str | None]]
"""What a consumer asks for the position its answer carries (:func:`write_position` on its
pool); ``None``: the answer goes without one."""

WRITE_POSITION = """
-- positions.write: the primary's log insert position now: at or past every record of every
-- transaction that committed before this statement began
SELECT pg_current_wal_insert_lsn()::text
"""

REPLAYED = """
-- positions.replayed: whether the server is a standby, and how far it has replayed its
-- primary's log (a primary, or a promoted standby, has everything it serves)
SELECT pg_is_in_recovery() AS standby, pg_last_wal_replay_lsn()::text AS replayed
"""

PRIMARY_WROTE = """
-- positions.primary: how far the primary's log is written (a position past it is none of its)
SELECT pg_current_wal_insert_lsn()::text
"""

CHECK_TIMEOUT_S = 1.0
"""How long a database has to say where its log stands, the wait for a connection included."""
TRUST_S = 1.0
"""How long a replica's replay position seen is trusted without asking again (a replica only
replays forward, but the server behind a URL may change: a failover, a DNS switch)."""


async def write_position(pool: asyncpg.Pool) -> str | None:
    """The primary's position now, for the answer to a write whose commit has returned;
    ``None`` when the database does not say within :data:`CHECK_TIMEOUT_S` (the write stands:
    its answer goes out without a position, and the caller reads within the replica's lag)."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            position = await pool.fetchval(WRITE_POSITION)
    except Exception as error:  # best effort: the write is committed, its answer must go
        log.warning("a write answered without its position: %s", type(error).__name__)
        return None
    return position if isinstance(position, str) else None


class ReplayWatch:
    """Whether the database behind ``pool`` has replayed a position. The greatest position it
    was seen to have replayed is trusted for :data:`TRUST_S`, so a position at or before it
    costs no round trip in that time; past it, one statement.

    A server that is not in recovery (a primary, a promoted standby) has every write it
    serves, and is asked again each time (it may be a standby again after a switch). A replica
    that cannot say (gone, slow, its pool exhausted) is taken not to have it: the caller reads
    the primary, which has.

    The check and the sources' reads must reach the same server: the read URL names one
    standby, not a balancer in front of several (one may be behind another)."""

    def __init__(self, pool: asyncpg.Pool, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.clock = clock
        self.replayed = -1
        """The greatest position seen replayed (-1: none yet)."""
        self.seen_at = -float("inf")

    async def reached(self, position: str) -> bool:
        wanted = position_value(position)
        if wanted <= self.replayed and self.clock() - self.seen_at <= TRUST_S:
            return True
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                row = await self.pool.fetchrow(REPLAYED)
        except Exception as error:  # best effort: the primary serves the build
            log.warning("the replica's replay position is unknown: %s", type(error).__name__)
            return False
        if row is None or not row["standby"]:
            return True
        if row["replayed"] is None:  # a standby that has replayed nothing yet
            return False
        self.replayed = position_value(row["replayed"])
        self.seen_at = self.clock()
        return wanted <= self.replayed


class PrimaryWatch:
    """Whether the primary has written a position: one a caller names past it is none of
    this cluster's (made up, or from another), and is read as no position at all, so that it
    cannot send builds to the primary for ever. The primary's position seen is kept (it only
    moves forward); a position past it costs one statement."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.written = -1

    async def wrote(self, position: str) -> bool:
        wanted = position_value(position)
        if wanted <= self.written:
            return True
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                text = await self.pool.fetchval(PRIMARY_WROTE)
        except Exception as error:  # best effort: take the caller's word, read the primary
            log.warning("the primary's position is unknown: %s", type(error).__name__)
            return True
        if isinstance(text, str):
            self.written = max(self.written, position_value(text))
        return wanted <= self.written
