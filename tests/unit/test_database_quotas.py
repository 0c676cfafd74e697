"""The build consumer's quota reader (contextcore/storage/quotas.py) on a fake database and a
clock the test moves: a known organization never waits for a read, and a read that fails keeps
what was known."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

from contextcore.quotas import NO_QUOTAS, Quotas
from contextcore.storage.quotas import DatabaseQuotas
from contextcore.storage.tenancy import TenantDatabase

ORG = uuid.UUID("7c000000-0000-4000-8000-0000000000a1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Database:
    """Answers each read with ``rate`` as the build_rate, after ``gate`` opens; or fails."""

    def __init__(self) -> None:
        self.rate: float | None = 5.0
        self.fail: Exception | None = None
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads = 0

    async def read(self, query: Any, organization_id: uuid.UUID, *args: Any) -> list[Any]:
        self.reads += 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        names = ("build_rate", "build_burst", "uploads_in_flight", "chunks_per_document")
        return [{**dict.fromkeys(names), "build_rate": self.rate, "stored_chunks": None,
                 "memory_revisions": None}]  # fmt: skip


def reader(database: Database, clock: Clock) -> DatabaseQuotas:
    return DatabaseQuotas(cast(TenantDatabase, database), ttl_s=5, timeout_s=0.5, clock=clock)


async def test_a_known_organization_is_served_at_once_and_refreshed_behind() -> None:
    database, clock = Database(), Clock()
    quotas = reader(database, clock)
    assert await quotas.quotas(ORG) == Quotas(build_rate=5.0)
    database.rate, database.gate = 7.0, asyncio.Event()  # the next read hangs until released
    clock.now += 6  # stale
    assert await quotas.quotas(ORG) == Quotas(build_rate=5.0)  # served without waiting
    assert await quotas.quotas(ORG) == Quotas(build_rate=5.0)
    await asyncio.sleep(0)  # the refresh starts
    assert database.reads == 2  # one refresh in flight, not one per request
    database.gate.set()
    await asyncio.sleep(0.01)
    assert await quotas.quotas(ORG) == Quotas(build_rate=7.0)


async def test_a_failed_read_keeps_what_was_known_and_a_first_one_waits_no_longer_than_its_bound(
) -> None:  # fmt: skip
    database, clock = Database(), Clock()
    quotas = reader(database, clock)
    await quotas.quotas(ORG)
    database.fail = RuntimeError("function contextcore_read_quotas does not exist")
    clock.now += 6
    await quotas.quotas(ORG)
    await asyncio.sleep(0.01)
    assert await quotas.quotas(ORG) == Quotas(build_rate=5.0)
    database.gate = asyncio.Event()  # a database that never answers
    other = uuid.UUID("7c000000-0000-4000-8000-0000000000b1")
    assert await asyncio.wait_for(quotas.quotas(other), 5) == NO_QUOTAS  # after timeout_s
