"""``contextcore quota``: the operator's per-organization quotas (migration 00038;
contextcore/quotas.py says what each one bounds and what a caller over it hears).

Written as the schema owner (CONTEXTCORE_DATABASE_OWNER_URL): the runtime login reads its own
organization's quotas and writes none."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any
from uuid import UUID

import asyncpg

from contextcore.quotas import NAMES, Quotas
from contextcore.storage.pool import connect
from contextcore.storage.settings import DatabaseSettings
from schemas.errors import command_parser, run_command

DESCRIPTION = """Quotas per organization: build requests a second (and the burst above it),
uploads in flight, chunks per document, stored chunks, memory revisions. An organization without
a value of its own has the default's (--default); neither: no limit, as after installation.
`show` prints what is in force; `set` changes the values it names (0 removes one); `clear`
removes an organization's own values. Running consumers apply a change within a few seconds."""

ORGANIZATION = "7b000000-0000-4000-8000-0000000000a1"

# quota.set: upsert the values named, keep the others. A row's key is its organization, the
# default's a null (UNIQUE NULLS NOT DISTINCT), so one statement serves both. The column names
# come from NAMES, never from input.
_SET = """
INSERT INTO organization_quotas AS q (organization_id, {columns}, updated_at)
VALUES ($1, {values}, now())
ON CONFLICT (organization_id) DO UPDATE SET {updates}, updated_at = now()
"""

# quota.in_force: an organization's quotas in force (its own, else the default's), or the
# default's when $1 is null (the owner's policy lets it read every row)
_IN_FORCE = "SELECT * FROM contextcore_quotas($1)"

# quota.clear: an organization's own values (or the default row) gone
_CLEAR = "DELETE FROM organization_quotas WHERE organization_id IS NOT DISTINCT FROM $1"


async def set_quotas(
    conn: asyncpg.Connection, organization_id: UUID | None, **values: float | None
) -> None:
    """Set the named quotas of ``organization_id`` (``None``: the default); a value of ``None``
    removes that quota from the row. Runs as the schema owner."""
    unknown = set(values) - set(NAMES)
    if unknown or not values:
        raise ValueError(f"name at least one quota of {', '.join(NAMES)}; not {sorted(unknown)}")
    names = [name for name in NAMES if name in values]
    sql = _SET.format(
        columns=", ".join(names),
        values=", ".join(f"${i}" for i in range(2, len(names) + 2)),
        updates=", ".join(f"{name} = EXCLUDED.{name}" for name in names),
    )
    await conn.execute(sql, organization_id, *(values[name] for name in names))


async def clear_quotas(conn: asyncpg.Connection, organization_id: UUID | None) -> None:
    await conn.execute(_CLEAR, organization_id)


async def quotas_in_force(conn: asyncpg.Connection, organization_id: UUID | None) -> Quotas:
    row = await conn.fetchrow(_IN_FORCE, organization_id)
    assert row is not None  # the function always returns one row
    return Quotas.of(row)


def _values(args: argparse.Namespace) -> dict[str, Any]:
    """The quotas named on the command line; 0 stands for "no limit" (a null)."""
    named = {name: getattr(args, name) for name in NAMES if getattr(args, name) is not None}
    return {name: (value or None) for name, value in named.items()}


async def _run(args: argparse.Namespace) -> int:
    settings = DatabaseSettings()
    organization = None if args.default else args.organization
    conn = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
    try:
        if args.action == "set":
            values = _values(args)
            if not values:
                raise ValueError("name a quota to set, e.g. --build-rate 20")
            await set_quotas(conn, organization, **values)
        elif args.action == "clear":
            await clear_quotas(conn, organization)
        quotas = await quotas_in_force(conn, organization)
    finally:
        await conn.close()
    print("the default" if organization is None else f"organization {organization}")
    for name in NAMES:
        value = getattr(quotas, name)
        print(f"  {name}: {'no limit' if value is None else f'{value:g}'}")
    return 0


def _non_negative(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float:
        value = kind(text)
        if value < 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, not {text!r}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Quotas per organization: show, set or clear them (the schema owner's act)."""
    parser = command_parser(
        "quota",
        DESCRIPTION,
        f"contextcore quota show --organization {ORGANIZATION}",
        f"contextcore quota set --organization {ORGANIZATION} --build-rate 20 --build-burst 40",
        "contextcore quota set --default --uploads-in-flight 500 --chunks-per-document 5000",
        f"contextcore quota clear --organization {ORGANIZATION}",
    )
    parser.add_argument("action", choices=("show", "set", "clear"))
    whose = parser.add_mutually_exclusive_group(required=True)
    whose.add_argument("--organization", type=UUID)
    whose.add_argument("--default", action="store_true", help="every organization's default")
    rate = _non_negative(float)
    whole = _non_negative(int)
    parser.add_argument("--build-rate", dest="build_rate", type=rate, help="builds a second")
    parser.add_argument("--build-burst", dest="build_burst", type=whole)
    parser.add_argument("--uploads-in-flight", dest="uploads_in_flight", type=whole)
    parser.add_argument("--chunks-per-document", dest="chunks_per_document", type=whole)
    parser.add_argument("--stored-chunks", dest="stored_chunks", type=whole)
    parser.add_argument("--memory-revisions", dest="memory_revisions", type=whole)
    args = parser.parse_args(argv)
    return run_command(
        "contextcore quota",
        lambda: asyncio.run(_run(args)),
        expected=(ValueError, asyncpg.PostgresError),
    )
