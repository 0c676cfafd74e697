"""The processed-message ledger that makes at-least-once consumers idempotent.

A consumer calls :func:`claim` inside the transaction that applies a message's effect. When the
claim returns ``False`` the message was applied before (a redelivery) and the consumer skips the
effect; the transaction that lost a race for the same id fails on the primary key instead of
applying the effect twice.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg

# Claim one message for one consumer; no row back means another delivery already committed it.
_CLAIM_SQL = """
INSERT INTO processed_messages (consumer, message_id)
VALUES ($1, $2)
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING 1
"""

# Forget claims older than the retention, a bounded batch at a time.
_PRUNE_SQL = """
DELETE FROM processed_messages
WHERE ctid IN (
    SELECT ctid FROM processed_messages
    WHERE processed_at < now() - $1::interval
    LIMIT $2
)
"""


async def claim(conn: asyncpg.Connection, consumer: str, message_id: str) -> bool:
    """``True`` when this is the first committed processing of ``message_id`` by ``consumer``."""
    return await conn.fetchval(_CLAIM_SQL, consumer, message_id) is not None


async def prune(conn: asyncpg.Connection, *, older_than: timedelta, batch: int = 10_000) -> int:
    """Delete up to ``batch`` claims older than ``older_than``; returns how many went."""
    status = await conn.execute(_PRUNE_SQL, older_than, batch)
    return int(status.split()[-1])
