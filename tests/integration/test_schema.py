"""``contextcore schema`` against a real PostgreSQL, run as the operator runs it."""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg
import pytest

from contextcore.storage import migrations
from tests.services import Database, Roles, Services, login_url

pytestmark = pytest.mark.integration


async def schema(command: str, owner_url: str | None, **extra: str) -> tuple[int, str, str]:
    """``contextcore schema COMMAND`` with the owner's URL (and ``extra`` settings) only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")}
    if owner_url is not None:
        env["CONTEXTCORE_DATABASE_OWNER_URL"] = owner_url
    env.update(extra)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "admin.schema",
        command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_init_applies_every_migration_once_and_verify_then_passes(
    empty_database: Database,
) -> None:
    empty_database_url = empty_database.owner_url
    code, out, err = await schema("verify", empty_database_url)
    assert code == 1
    labels = [m.label for m in migrations.load_migrations()]
    assert err.splitlines() == [
        f"contextcore schema: migration {label} is pending" for label in labels
    ]

    code, out, _ = await schema("init", empty_database_url)
    assert code == 0
    assert out.splitlines() == [f"applied {label}" for label in labels]

    code, out, _ = await schema("init", empty_database_url)
    assert (code, out.strip()) == (0, "schema is up to date; nothing to apply")
    code, out, _ = await schema("verify", empty_database_url)
    assert code == 0
    assert out.startswith("schema matches the code")


async def test_every_migration_applies_in_a_session_of_its_own(
    empty_database: Database,
) -> None:
    """An upgrade starts a new session at whatever version the database is: no migration may
    lean on what an earlier one left in the session (pgvector's hnsw.* settings exist only
    once its library is loaded, say). Each is applied on a connection of its own."""
    every = migrations.load_migrations()
    for count, migration in enumerate(every, start=1):
        conn = await asyncpg.connect(empty_database.owner_url)
        try:
            applied = await migrations.apply_pending(conn, every[:count])
        finally:
            await conn.close()
        assert [m.label for m in applied] == [migration.label]


async def test_verify_fails_on_a_tampered_checksum(database: Database) -> None:
    database_url = database.owner_url
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
        "contextcore schema: migration 00001_foundation was modified after it was applied "
        f"(recorded sha256 {'0' * 12}…, file {migrations.load_migrations()[0].checksum[:12]}…)"
    ]
    code, _, err = await schema("init", database_url)  # init refuses to build on a tampered past
    assert code == 1
    assert "modified after it was applied" in err


async def test_verify_fails_on_a_migration_unknown_to_the_code(database: Database) -> None:
    database_url = database.owner_url
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


async def test_verify_fails_on_a_pending_migration(database: Database) -> None:
    database_url = database.owner_url
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DELETE FROM contextcore_migrations WHERE version = 2")
    finally:
        await conn.close()
    code, _, err = await schema("verify", database_url)
    assert (code, err.strip()) == (
        1,
        "contextcore schema: migration 00002_processed_messages is pending",
    )


async def test_a_missing_database_setting_exits_2_and_an_unreachable_one_3() -> None:
    code, _, err = await schema("verify", None)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "CONTEXTCORE_DATABASE_OWNER_URL is not set" in err

    code, _, err = await schema("verify", "postgresql://nobody:secret@127.0.0.1:1/none")
    assert code == 3
    assert len(err.strip().splitlines()) == 1
    assert "cannot reach the database at postgresql://nobody:***@127.0.0.1:1/none" in err
    assert "secret" not in err


async def test_concurrent_inits_apply_each_migration_exactly_once(
    empty_database: Database,
) -> None:
    empty_database_url = empty_database.owner_url
    results = await asyncio.gather(*(schema("init", empty_database_url) for _ in range(3)))
    applied = [line for _, out, _ in results for line in out.splitlines() if "applied" in line]
    assert all(code == 0 for code, _, _ in results)
    assert sorted(applied) == sorted(f"applied {m.label}" for m in migrations.load_migrations())


async def test_a_postgresql_error_during_init_is_one_line_and_exit_1(
    services: Services, roles: Roles
) -> None:
    """Issue 7, defect 5: no traceback. The owner may not install pgvector (only an
    administrator may), so on a database nobody provisioned the first migration fails."""
    name = f"cc_test_bare_{os.getpid()}"
    admin = await asyncpg.connect(services.admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" OWNER "{roles.owner.user}"')
        code, _, err = await schema("init", login_url(services.admin_url, roles.owner, name))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    assert code == 1
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith(
        "contextcore schema: migration 00001_foundation failed and was not applied: "
        "permission denied to create extension"
    )


async def test_provision_creates_two_credentials_once(services: Services) -> None:
    tag = os.getpid()
    name, owner, runtime = f"cc_prov_{tag}", f"cc_prov_owner_{tag}", f"cc_prov_runtime_{tag}"
    server = services.admin_url.rsplit("@", 1)[1].rsplit("/", 1)[0]
    urls = {
        "CONTEXTCORE_DATABASE_ADMIN_URL": services.admin_url,
        "CONTEXTCORE_DATABASE_URL": f"postgresql://{runtime}:r-secret@{server}/{name}",
    }
    owner_url = f"postgresql://{owner}:o-secret@{server}/{name}"
    try:
        code, out, err = await schema("provision", owner_url, **urls)
        assert code == 0, err
        assert out.splitlines() == [
            f"created login role {owner}",
            "created login role " + runtime,
            f"created database {name} owned by {owner}",
        ]
        code, out, _ = await schema("provision", owner_url, **urls)
        assert (code, out.strip()) == (0, "roles and database are in place; nothing to create")
        code, out, err = await schema("init", owner_url)
        assert code == 0, err
        conn = await asyncpg.connect(urls["CONTEXTCORE_DATABASE_URL"])
        try:
            row = await conn.fetchrow(
                "SELECT rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolbypassrls "
                "FROM pg_roles WHERE rolname = current_user"
            )
            assert row is not None
            assert tuple(row) == (False, False, False, False, False)
            owned = await conn.fetchval(
                "SELECT count(*) FROM pg_class WHERE relowner = "
                "(SELECT oid FROM pg_roles WHERE rolname = current_user)"
            )
            assert owned == 0
        finally:
            await conn.close()
        same = {**urls, "CONTEXTCORE_DATABASE_URL": owner_url}
        code, _, err = await schema("provision", owner_url, **same)
        assert code == 2
        assert "the runtime login and the owner are one role" in err
    finally:
        admin = await asyncpg.connect(services.admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.execute(f'DROP ROLE IF EXISTS "{runtime}"')
            await admin.execute(f'DROP ROLE IF EXISTS "{owner}"')
        finally:
            await admin.close()


async def test_the_vector_extension_is_installed(database_url: str) -> None:
    """Installed by the administrator at provisioning; usable by the runtime login."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE contextcore_app")
            distance = await conn.fetchval("SELECT '[1,0]'::vector <-> '[0,1]'::vector")
    finally:
        await conn.close()
    assert distance == pytest.approx(2**0.5)
