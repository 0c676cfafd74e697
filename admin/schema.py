"""``contextcore schema``: the database schema commands."""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from contextcore.storage import migrations
from contextcore.storage.pool import connect
from contextcore.storage.provision import provision
from contextcore.storage.settings import DatabaseSettings
from schemas.errors import command_parser, run_command


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


SCHEMA = """Create, migrate and check the database: roles, database, schema.

  provision    create the roles and the database, as an administrator
               (CONTEXTCORE_DATABASE_ADMIN_URL), for the owner's and the runtime's URLs
  init         apply the pending migrations, as the schema owner
               (CONTEXTCORE_DATABASE_OWNER_URL)
  verify       read-only: check the owner's view of the schema against the code

A schema that does not match prints one line per problem."""


def main(argv: list[str] | None = None) -> int:
    """Provision the database, apply migrations, verify the schema."""
    parser = command_parser(
        "schema", SCHEMA, "contextcore schema provision", "contextcore schema init"
    )
    parser.add_argument("command", choices=["init", "verify", "provision"])
    args = parser.parse_args(argv)
    return run_command(
        "contextcore schema",
        lambda: asyncio.run(_run(args.command, DatabaseSettings())),
        expected=(asyncpg.PostgresError,),
    )


if __name__ == "__main__":
    sys.exit(main())
