"""Probes of the rules the database holds for agent memory (docs/memory.md, "The chain").

Each probe writes through real PostgreSQL and raises ``AssertionError`` when its rule does not
hold. ``test_memory_storage`` runs every probe on the real schema; ``test_memory_rules`` drops
each rule in a scratch database and checks that its probe then fails: a test that could not
fail would prove nothing (issue 19).

The racing probes make two writers genuinely overlap on one chain, in two transactions on two
connections, in a fixed order: the first applies its write and keeps its transaction open; the
second starts, and either waits on the first (the unique index it would break) or finishes;
then the first commits, then the second. Nothing depends on timing: the probe waits on the
database's own lock table, not on a sleep.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from contextcore.memory.adapters import store
from contextcore.memory.service import forget_write, remember_write
from schemas.memory import Invoker, MemoryCandidate
from tests.integration.helpers import as_service_role, waits_on_a_lock
from tests.services import Database

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000a1")
DEFINITION = uuid.UUID("7b000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7b000000-0000-4000-8000-00000000e001")
INVOKER = Invoker(organization_id=ORG, definition_id=DEFINITION, user_id=USER)
ATTRIBUTE = "observation.raced"
KEY = f"user:{USER}:{ATTRIBUTE}"

Write = dict[str, Any]
Probe = Callable[[Database], Awaitable[None]]


def remember(text: str) -> Write:
    candidate = MemoryCandidate(scope="user", attribute=ATTRIBUTE, text=text)
    return remember_write(INVOKER, candidate, uuid.uuid4().hex)


def forget(memory_id: uuid.UUID) -> Write:
    return forget_write(INVOKER, memory_id, uuid.uuid4().hex)


async def _scoped(conn: asyncpg.Connection) -> asyncpg.transaction.Transaction:
    """A transaction as ``TenantDatabase.writing_each`` opens it: the service role, no scope."""
    transaction = conn.transaction()
    await transaction.start()
    await as_service_role(conn)
    return transaction


async def apply_alone(database: Database, write: Write) -> Any:
    conn = await asyncpg.connect(database.url)
    try:
        transaction = await _scoped(conn)
        (answer,) = await store.apply(conn, [write])
        await transaction.commit()
        return answer
    finally:
        await conn.close()


async def overlapping(database: Database, first: Write, second: Write) -> list[object]:
    """Both writes, each in its own transaction, overlapping as the module says. Returns each
    one's answer, or the error its commit raised."""
    conns = [await asyncpg.connect(database.url) for _ in range(2)]
    watcher = await asyncpg.connect(database.admin_url)
    try:
        one = await _scoped(conns[0])
        two = await _scoped(conns[1])
        answers: list[object] = list(await store.apply(conns[0], [first]))
        second_applies = asyncio.create_task(store.apply(conns[1], [second]))
        # it waits on the first (the rule holds), or finishes (the rule is gone)
        await waits_on_a_lock(watcher, conns[1].get_server_pid(), second_applies)
        await one.commit()
        try:
            answers += await second_applies
            await two.commit()
        except asyncpg.PostgresError as error:
            answers.append(error)
            await two.rollback()
        return answers
    finally:
        for conn in (*conns, watcher):
            await conn.close()


@asynccontextmanager
async def _organization(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection, the probes' organization made."""
    admin = await asyncpg.connect(database.admin_url)
    try:
        await admin.execute(
            "INSERT INTO organizations (id, name) VALUES ($1, 'raced') ON CONFLICT DO NOTHING",
            ORG,
        )
        yield admin
    finally:
        await admin.close()


async def _one_linear_chain(admin: asyncpg.Connection) -> list[asyncpg.Record]:
    rows = await admin.fetch(
        "SELECT id, supersedes_id, text, forgotten_at FROM memories"
        " WHERE organization_id = $1 AND subject_key = $2",
        ORG,
        KEY,
    )
    roots = [row for row in rows if row["supersedes_id"] is None]
    assert len(roots) == 1, f"{len(roots)} roots: {rows}"
    parents = [row["supersedes_id"] for row in rows if row["supersedes_id"] is not None]
    assert len(parents) == len(set(parents)), f"a revision with two children: {rows}"
    heads = await admin.fetchval(
        "SELECT count(*) FROM memory_heads WHERE organization_id = $1 AND subject_key = $2",
        ORG,
        KEY,
    )
    assert heads == 1, f"{heads} heads: {rows}"
    return rows


# ----------------------------------------------------------------------------- racing writers


async def roots_racing(database: Database) -> None:
    """Two writers create one chain: one root, the other supersedes it (memories_one_root)."""
    async with _organization(database) as admin:
        await overlapping(database, remember("first"), remember("second"))
        assert len(await _one_linear_chain(admin)) == 2


async def remember_racing_remember(database: Database) -> None:
    """Two writers supersede one head: the second supersedes the first's (memories_one_child)."""
    async with _organization(database) as admin:
        await apply_alone(database, remember("root"))
        await overlapping(database, remember("first"), remember("second"))
        assert len(await _one_linear_chain(admin)) == 3


async def forget_racing_remember(database: Database) -> None:
    """A forget and a remember on one live head: the remember revives after the tombstone."""
    async with _organization(database) as admin:
        root = await apply_alone(database, remember("root"))
        answers = await overlapping(database, forget(root.memory.id), remember("again"))
        rows = await _one_linear_chain(admin)
        assert len(rows) == 3
        assert [getattr(a, "change", a) for a in answers] == ["forgotten", "revived"]


async def forget_racing_forget(database: Database) -> None:
    """Two forgets of one live head: one tombstone; the other is refused ``not_live``."""
    async with _organization(database) as admin:
        root = await apply_alone(database, remember("root"))
        answers = await overlapping(database, forget(root.memory.id), forget(root.memory.id))
        assert len(await _one_linear_chain(admin)) == 2
        assert getattr(answers[1], "reason", answers[1]) == "not_live"


# ----------------------------------------------------------------------------- raw SQL, any role


async def _refused(admin: asyncpg.Connection, what: str, statement: str, *args: object) -> None:
    try:
        async with admin.transaction():
            await admin.execute(statement, *args)
    except asyncpg.PostgresError:
        return
    raise AssertionError(f"{what}: the database accepted it")


async def chain_identity(database: Database) -> None:
    """A child cannot leave its parent's chain (memories_child_keeps_the_chain)."""
    async with _organization(database) as admin:
        root = await apply_alone(database, remember("root"))
        other_key = f"user:{USER}:observation.elsewhere"
        await _refused(
            admin,
            "a child under another key",
            "INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,"
            " text, supersedes_id) VALUES ($1, $2, 'user', $3, $4, 'moved', $5)",
            ORG,
            DEFINITION,
            USER,
            other_key,
            root.memory.id,
        )
        await _refused(
            admin,
            "a child of another definition",
            "INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,"
            " text, supersedes_id) VALUES ($1, $2, 'user', $3, $4, 'moved', $5)",
            ORG,
            uuid.uuid4(),
            USER,
            KEY,
            root.memory.id,
        )


async def root_is_not_a_tombstone(database: Database) -> None:
    async with _organization(database) as admin:
        await _refused(
            admin,
            "a tombstone as a root",
            "INSERT INTO memories (organization_id, definition_id, scope, user_id, subject_key,"
            " forgotten_at) VALUES ($1, $2, 'user', $3, $4, now())",
            ORG,
            DEFINITION,
            USER,
            KEY,
        )


async def append_only(database: Database) -> None:
    """No role changes a revision: not its text, not its chain, not its time."""
    async with _organization(database) as admin:
        root = await apply_alone(database, remember("root"))
        for what, statement in (
            ("the text changed", "UPDATE memories SET text = 'edited' WHERE id = $1"),
            ("backdated", "UPDATE memories SET created_at = now() - interval '1y' WHERE id = $1"),
            (
                "forgotten in place",
                "UPDATE memories SET text = NULL, forgotten_at = now() WHERE id = $1",
            ),
        ):
            await _refused(admin, what, statement, root.memory.id)


async def immutable_journal(database: Database) -> None:
    """A journal answer, once recorded, never changes."""
    async with _organization(database) as admin:
        written = remember("root")
        await apply_alone(database, written)
        await _refused(
            admin,
            "an answer rewritten",
            "UPDATE memory_writes SET outcome = 'refused', reason = 'duplicate'"
            " WHERE idempotency_key = $1",
            written["idempotency_key"],
        )


RULES: dict[str, tuple[str, Probe]] = {
    "one root": ("DROP INDEX memories_one_root", roots_racing),
    "one child (remember against remember)": (
        "ALTER TABLE memories DROP CONSTRAINT memories_one_child",
        remember_racing_remember,
    ),
    "one child (forget against remember)": (
        "ALTER TABLE memories DROP CONSTRAINT memories_one_child",
        forget_racing_remember,
    ),
    "one child (forget against forget)": (
        "ALTER TABLE memories DROP CONSTRAINT memories_one_child",
        forget_racing_forget,
    ),
    "chain identity": (
        "ALTER TABLE memories DROP CONSTRAINT memories_child_keeps_the_chain",
        chain_identity,
    ),
    "root is not a tombstone": (
        "ALTER TABLE memories DROP CONSTRAINT memories_root_is_not_a_tombstone",
        root_is_not_a_tombstone,
    ),
    "append only": ("DROP TRIGGER memories_append_only ON memories", append_only),
    "immutable journal": (
        "DROP TRIGGER memory_writes_answer_once ON memory_writes",
        immutable_journal,
    ),
}
"""Each rule: the statement that removes it, and the probe that must then fail."""
