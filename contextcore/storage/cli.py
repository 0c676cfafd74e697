"""``contextcore-schema init | verify``: apply or check the migrations.

Both need ``CONTEXTCORE_DATABASE_URL``; a missing or unreachable database prints one line and
exits 2. ``verify`` exits 1 with one line per problem and never writes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from contextcore.errors import ContextcoreError, SchemaError
from contextcore.settings import Settings
from contextcore.storage import migrations
from contextcore.storage.pool import connect


async def _run(command: str, settings: Settings) -> int:
    conn = await connect(
        settings.require_database_url(), timeout_s=settings.database_connect_timeout_s
    )
    try:
        if command == "init":
            done = await migrations.apply_pending(conn)
            for migration in done:
                print(f"applied {migration.label}")
            if not done:
                print("schema is up to date; nothing to apply")
            return 0
        try:
            await migrations.verify(conn)
        except SchemaError as error:
            for problem in error.problems:
                print(problem, file=sys.stderr)
            return 1
        print(f"schema matches the code ({len(migrations.load_migrations())} migrations)")
        return 0
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextcore-schema", description=__doc__)
    parser.add_argument("command", choices=["init", "verify"])
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args.command, Settings()))
    except SchemaError as error:
        for problem in error.problems:
            print(f"contextcore-schema: {problem}", file=sys.stderr)
        return 1
    except ContextcoreError as error:
        print(f"contextcore-schema: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
