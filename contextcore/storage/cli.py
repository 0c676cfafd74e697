"""``contextcore-schema init | verify | provision``: the schema commands.

* ``init`` applies pending migrations as the schema owner (``CONTEXTCORE_DATABASE_OWNER_URL``).
* ``verify`` is read-only and checks the owner's view of the schema against the code.
* ``provision`` creates the roles and the database (``contextcore/storage/provision.py``) as an
  administrator (``CONTEXTCORE_DATABASE_ADMIN_URL``), for the owner and runtime URLs.

Exit status (``contextcore.errors.exit_code``): 0; 1 with one line per problem when the schema
does not match or PostgreSQL refuses; 2 when a setting is missing or the database unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import asyncpg

from contextcore.errors import run_command
from contextcore.settings import DatabaseSettings
from contextcore.storage import migrations
from contextcore.storage.pool import connect
from contextcore.storage.provision import provision


async def _run(command: str, settings: DatabaseSettings) -> int:
    if command == "provision":
        created = await provision(
            settings.require_admin_url(),
            owner_url=settings.require_owner_url(),
            runtime_url=settings.require_url(),
        )
        print("\n".join(created) or "roles and database are in place; nothing to create")
        return 0
    conn = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
    try:
        if command == "init":
            done = await migrations.apply_pending(conn)
            for migration in done:
                print(f"applied {migration.label}")
            if not done:
                print("schema is up to date; nothing to apply")
            return 0
        await migrations.verify(conn)
        print(f"schema matches the code ({len(migrations.load_migrations())} migrations)")
        return 0
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextcore-schema", description=__doc__)
    parser.add_argument("command", choices=["init", "verify", "provision"])
    args = parser.parse_args(argv)
    return run_command(
        "contextcore-schema",
        lambda: asyncio.run(_run(args.command, DatabaseSettings())),
        expected=(asyncpg.PostgresError,),
    )


if __name__ == "__main__":
    sys.exit(main())
