"""contextcore/storage/schema.sql is the schema after the last migration (issue 36, item 3): a
fresh database migrated by the code dumps to exactly the committed file, so a migration that
changes the schema fails here until ``python -m devstack.schema_snapshot`` is run."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from devstack.schema_snapshot import SNAPSHOT, snapshot
from tests.services import Database, Roles

pytestmark = pytest.mark.integration


async def test_the_committed_snapshot_is_the_migrated_schema(
    database: Database, roles: Roles
) -> None:
    dumped = await asyncio.to_thread(snapshot, database.admin_url, roles.owner.user)
    assert dumped == SNAPSHOT.read_text(), (
        f"{SNAPSHOT} is stale: run python -m devstack.schema_snapshot"
    )


async def test_a_schema_change_makes_the_snapshot_stale(database: Database, roles: Roles) -> None:
    """The comparison sees a change as small as one column (what a new migration would add)."""
    conn = await asyncpg.connect(database.owner_url)
    try:
        await conn.execute("ALTER TABLE organizations ADD COLUMN snapshot_probe integer")
    finally:
        await conn.close()
    dumped = await asyncio.to_thread(snapshot, database.admin_url, roles.owner.user)
    assert dumped != SNAPSHOT.read_text()
    assert "snapshot_probe integer" in dumped
