"""One organization's memory health: live chains, chain lengths, how often writes are refused
and why, and which live memories the memory source drops at read and why
(``contextcore memory health``). Read in the organization's scope only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

import asyncpg

from contextcore.memory.refs import drop_reason, stored_subject
from contextcore.storage.application import resolve
from contextcore.storage.tenancy import TenantDatabase, TenantQuery

CHAINS = TenantQuery(
    "memory.health.chains",
    """
-- memory.health.chains: chains by their number of revisions, and how many are live
SELECT length, count(*) AS chains, count(*) FILTER (WHERE live) AS live
FROM (
    SELECT count(*) AS length, bool_or(m.forgotten_at IS NULL AND h.id IS NOT NULL) AS live
    FROM memories AS m
    LEFT JOIN memory_heads AS h ON h.organization_id = m.organization_id AND h.id = m.id
    WHERE m.organization_id = $1
    GROUP BY m.definition_id, m.scope, m.scope_owner_id, m.subject_key
) AS chain
GROUP BY length
ORDER BY length
""",
)

WRITES = TenantQuery(
    "memory.health.writes",
    """
-- memory.health.writes: write calls of the window, by outcome and refusal reason
SELECT operation, outcome, coalesce(reason, '') AS reason, count(*) AS calls
FROM memory_writes
WHERE organization_id = $1 AND created_at > now() - $2::interval AND outcome IS NOT NULL
GROUP BY operation, outcome, reason
ORDER BY operation, outcome, reason
""",
)


LIVE_REFS = TenantQuery(
    "memory.health.live_refs",
    """
-- memory.health.live_refs: the live memories that name a subject (only they can be dropped)
SELECT scope, user_id, subject_refs
FROM live_memories
WHERE organization_id = $1 AND subject_refs <> '[]'::jsonb
""",
)


UNJOURNALED = TenantQuery(
    "memory.health.unjournaled",
    """
-- memory.health.unjournaled: invalid_input refusals the journal holds no row for, by whole
-- days: the window's first day counts whole
SELECT operation, 'refused' AS outcome, reason, sum(calls)::bigint AS calls
FROM memory_refusals
WHERE organization_id = $1 AND day >= (now() - $2::interval)::date
GROUP BY operation, reason
""",
)


@dataclass(frozen=True)
class MemoryHealth:
    organization_id: UUID
    chains: int
    live_chains: int
    chain_lengths: dict[int, int]
    """Revisions per chain (a tombstone counts) -> how many chains have that many."""
    window: timedelta
    calls: dict[str, int]
    """``<operation> <outcome>[ <reason>]`` -> calls in the window."""
    dropped_at_read: dict[str, int]
    """Live memories the memory source drops now, by reason (``malformed_ref``,
    ``unknown_kind``, ``unresolved_ref``): what the tenant guard keeps out of every brief."""

    @property
    def refusal_rate(self) -> float | None:
        total = sum(self.calls.values())
        refused = sum(n for key, n in self.calls.items() if " refused" in key)
        return refused / total if total else None


async def health(
    database: TenantDatabase, organization_id: UUID, window: timedelta
) -> MemoryHealth:
    dropped: dict[str, int] = {}
    async with database.scoped(organization_id) as tenant:
        chains = await tenant.fetch(CHAINS)
        writes = [*await tenant.fetch(WRITES, window), *await tenant.fetch(UNJOURNALED, window)]
        subjects = []
        for row in await tenant.fetch(LIVE_REFS):
            ref, malformed = stored_subject(
                row["subject_refs"], row["scope"], organization_id, row["user_id"]
            )
            if malformed:
                dropped["malformed_ref"] = dropped.get("malformed_ref", 0) + 1
            else:
                subjects.append(ref)
        resolved = await resolve(tenant, [ref for ref in subjects if ref is not None])
    for ref in subjects:
        if (reason := drop_reason(ref, resolved)) is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
    return MemoryHealth(
        organization_id=organization_id,
        chains=sum(r["chains"] for r in chains),
        live_chains=sum(r["live"] for r in chains),
        chain_lengths={r["length"]: r["chains"] for r in chains},
        window=window,
        calls=_calls(writes),
        dropped_at_read=dict(sorted(dropped.items())),
    )


def _calls(rows: list[asyncpg.Record]) -> dict[str, int]:
    calls: dict[str, int] = {}
    for r in rows:
        key = " ".join(p for p in (r["operation"], r["outcome"], r["reason"]) if p)
        calls[key] = calls.get(key, 0) + r["calls"]
    return dict(sorted(calls.items()))
