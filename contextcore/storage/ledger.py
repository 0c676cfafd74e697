"""The processed-message ledger that makes at-least-once consumers idempotent.

A consumer calls :func:`claim` inside the write scope (``TenantDatabase.writing``) that applies a
message's effect: both commit or neither does. When the claim returns ``False`` the message was
applied before (a redelivery) and the consumer skips the effect; a transaction that lost a race
for the same key waits on the unique index and then finds the winner's claim.

A claim belongs to the scope it was made in: ``(organization, consumer, message id)``, the
platform being a null organization. Two tenants may use one idempotency key without either
message being skipped (migration 00005), and RLS keeps a scope from reading or writing another's
claims.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from contextcore.storage.tenancy import SERVICE_ROLE, TenantConnection, TenantQuery, service_role

CLAIM = TenantQuery(
    "ledger.claim",
    """
-- ledger.claim: the first committed processing of this message in this scope returns a row;
-- a redelivery (or the loser of a race, once the winner committed) returns none.
INSERT INTO processed_messages (organization_id, consumer, message_id)
VALUES ($1, $2, $3)
ON CONFLICT (organization_id, consumer, message_id) DO NOTHING
RETURNING 1
""",
)

# Expired claims of every tenant, a bounded batch; the function refuses a non-positive batch.
_PRUNE_SQL = "SELECT contextcore_prune_processed_messages($1::interval, $2)"


async def claim(tenant: TenantConnection, consumer: str, message_id: str) -> bool:
    """``True`` when this is the first committed processing of ``message_id`` by ``consumer``
    in the scope of ``tenant``."""
    return await tenant.fetchval(CLAIM, consumer, message_id) is not None


async def prune(
    conn: asyncpg.Connection,
    *,
    older_than: timedelta,
    batch: int = 10_000,
    role: str = SERVICE_ROLE,
) -> int:
    """Delete up to ``batch`` claims older than ``older_than``, across tenants; how many went.

    Runs as the service role through a SECURITY DEFINER function: the runtime login may delete
    expired claims and nothing else of another tenant's, and never a claim younger than a day
    (the function's floor, migration 00006), whatever ``older_than`` says.

    Raises:
        ValueError: ``batch`` or ``older_than`` is not positive.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"prune batch must be a positive integer, not {batch!r}")
    if older_than <= timedelta(0):
        raise ValueError(f"prune retention must be positive, not {older_than}")
    async with service_role(conn, role=role):
        removed: int = await conn.fetchval(_PRUNE_SQL, older_than, batch)
    return removed
