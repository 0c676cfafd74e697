"""``contextcore-schema`` against a real PostgreSQL, run as the operator runs it."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

import asyncpg
import pytest

from contextcore.storage import ledger, migrations

pytestmark = pytest.mark.integration


async def schema(command: str, database_url: str | None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONTEXTCORE_DATABASE_URL"}
    if database_url is not None:
        env["CONTEXTCORE_DATABASE_URL"] = database_url
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "contextcore.storage.cli",
        command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_init_applies_every_migration_once_and_verify_then_passes(
    empty_database_url: str,
) -> None:
    code, out, err = await schema("verify", empty_database_url)
    assert code == 1
    labels = [m.label for m in migrations.load_migrations()]
    assert err.splitlines() == [f"migration {label} is pending" for label in labels]

    code, out, _ = await schema("init", empty_database_url)
    assert code == 0
    assert out.splitlines() == [f"applied {label}" for label in labels]

    code, out, _ = await schema("init", empty_database_url)
    assert (code, out.strip()) == (0, "schema is up to date; nothing to apply")
    code, out, _ = await schema("verify", empty_database_url)
    assert code == 0
    assert out.startswith("schema matches the code")


async def test_verify_fails_on_a_tampered_checksum(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE contextcore_migrations SET checksum = repeat('0', 64) WHERE version = 1"
        )
    finally:
        await conn.close()
    code, _, err = await schema("verify", database_url)
    assert code == 1
    assert err.splitlines() == [
        "migration 00001_foundation was modified after it was applied "
        f"(recorded sha256 {'0' * 12}…, file {migrations.load_migrations()[0].checksum[:12]}…)"
    ]
    code, _, err = await schema("init", database_url)  # init refuses to build on a tampered past
    assert code == 1
    assert "modified after it was applied" in err


async def test_verify_fails_on_a_migration_unknown_to_the_code(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO contextcore_migrations (version, name, checksum) "
            "VALUES (99999, 'from_the_future', repeat('a', 64))"
        )
    finally:
        await conn.close()
    code, _, err = await schema("verify", database_url)
    assert code == 1
    assert "99999_from_the_future is applied but unknown to this code" in err


async def test_verify_fails_on_a_pending_migration(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DELETE FROM contextcore_migrations WHERE version = 2")
    finally:
        await conn.close()
    code, _, err = await schema("verify", database_url)
    assert (code, err.strip()) == (1, "migration 00002_processed_messages is pending")


async def test_a_missing_or_unreachable_database_is_one_line_and_exit_2() -> None:
    code, _, err = await schema("verify", None)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "CONTEXTCORE_DATABASE_URL is not set" in err

    code, _, err = await schema("verify", "postgresql://nobody:secret@127.0.0.1:1/none")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "cannot reach the database at postgresql://nobody:***@127.0.0.1:1/none" in err
    assert "secret" not in err


async def test_concurrent_inits_apply_each_migration_exactly_once(
    empty_database_url: str,
) -> None:
    results = await asyncio.gather(*(schema("init", empty_database_url) for _ in range(3)))
    applied = [line for _, out, _ in results for line in out.splitlines() if "applied" in line]
    assert all(code == 0 for code, _, _ in results)
    assert sorted(applied) == sorted(f"applied {m.label}" for m in migrations.load_migrations())


async def test_the_processed_message_ledger_claims_once_and_prunes(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert await ledger.claim(conn, "memory", "topic/0/41") is True
        assert await ledger.claim(conn, "memory", "topic/0/41") is False
        assert await ledger.claim(conn, "upload", "topic/0/41") is True  # per consumer
        await conn.execute(
            "UPDATE processed_messages SET processed_at = now() - interval '8 days' "
            "WHERE consumer = 'memory'"
        )
        assert await ledger.prune(conn, older_than=timedelta(days=7)) == 1
        assert await conn.fetchval("SELECT count(*) FROM processed_messages") == 1
        assert await ledger.claim(conn, "memory", "topic/0/41") is True  # forgotten, re-claimable
    finally:
        await conn.close()


async def test_the_vector_extension_is_installed(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        distance = await conn.fetchval("SELECT '[1,0]'::vector <-> '[0,1]'::vector")
    finally:
        await conn.close()
    assert distance == pytest.approx(2**0.5)
