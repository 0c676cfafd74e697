"""Every rule the database holds for agent memory has a test that fails without it (issue 19).

Each probe of ``memory_rules`` passes on the real schema, and fails in a database where the one
statement that removes its rule has run (a fresh copy of the migrated template per case)."""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration import memory_rules
from tests.services import Database

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("rule", list(memory_rules.RULES))
async def test_the_rule_holds(database: Database, rule: str) -> None:
    _, probe = memory_rules.RULES[rule]
    await probe(database)


@pytest.mark.parametrize("rule", list(memory_rules.RULES))
async def test_its_probe_fails_without_the_rule(database: Database, rule: str) -> None:
    removal, probe = memory_rules.RULES[rule]
    admin = await asyncpg.connect(database.admin_url)
    try:
        await admin.execute(removal)
    finally:
        await admin.close()
    with pytest.raises(AssertionError):
        await probe(database)
