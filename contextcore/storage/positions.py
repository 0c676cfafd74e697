"""Read-your-writes across a replica: the primary's log position a write is answered with, and
whether a replica has replayed up to a position (docs/scaling.md).

A position taken **after** a write's commit returned lies past the commit's record, so a
standby whose replay has reached it has applied the commit, and any snapshot it takes from
then on sees the write. Taken inside the transaction it would not: the commit's record comes
after. Both functions are open to every login (no privilege to grant).
"""

from __future__ import annotations

import logging

import asyncpg

from schemas.position import position_value

log = logging.getLogger("contextcore.positions")

WRITE_POSITION = """
-- positions.write: the primary's log insert position now: at or past every record of every
-- transaction that committed before this statement began
SELECT pg_current_wal_insert_lsn()::text
"""

REPLAYED = """
-- positions.replayed: how far a standby has replayed its primary's log; NULL on a primary,
-- which has applied all it wrote
SELECT pg_last_wal_replay_lsn()::text
"""

CHECK_TIMEOUT_S = 1.0
"""How long a replica has to say where its replay stands; past it, the read goes to the
primary."""


async def write_position(pool: asyncpg.Pool) -> str | None:
    """The primary's position now, for the answer to a write whose commit has returned;
    ``None`` when the database does not say within :data:`CHECK_TIMEOUT_S` (the write stands:
    its answer goes out without a position, and the caller reads within the replica's lag)."""
    try:
        position = await pool.fetchval(WRITE_POSITION, timeout=CHECK_TIMEOUT_S)
    except (TimeoutError, asyncpg.PostgresError, OSError) as error:
        log.warning("a write answered without its position: %s", type(error).__name__)
        return None
    return position if isinstance(position, str) else None


class ReplayWatch:
    """Whether the database behind ``pool`` has replayed a position: the greatest position it
    was seen to have replayed is kept, so a position at or before it costs no round trip (a
    replay only moves forward), and one past it costs one statement.

    A primary answers that it has everything. A replica that cannot say (gone, slow) is taken
    not to have it: the caller reads the primary, which has."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.replayed = -1
        """The greatest position seen replayed (-1: none yet)."""

    async def reached(self, position: str) -> bool:
        wanted = position_value(position)
        if wanted <= self.replayed:
            return True
        try:
            text = await self.pool.fetchval(REPLAYED, timeout=CHECK_TIMEOUT_S)
        except (TimeoutError, asyncpg.PostgresError, OSError) as error:
            log.warning("the replica's replay position is unknown: %s", type(error).__name__)
            return False
        if text is None:  # a primary
            self.replayed = 2**64 - 1
            return True
        self.replayed = max(self.replayed, position_value(text))
        return wanted <= self.replayed
