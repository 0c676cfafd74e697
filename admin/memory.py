"""``contextcore memory health`` and ``contextcore memory erase``: the operator's view of agent
memory, read from the database (the client's ``remember`` and ``forget`` go over Kafka instead,
producers/memory_cli.py)."""

from __future__ import annotations

import argparse
import asyncio
from datetime import timedelta
from uuid import UUID

import asyncpg

from contextcore.memory.adapters.erasure import Selector, erase, subject_selector
from contextcore.memory.adapters.health import health
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import TenantDatabase
from producers.command import whole
from schemas.errors import command_parser, run_command

HEALTH = """One organization's memory: live chains, chain lengths, write calls and refusals, and
what the memory source drops at read. It reads as the runtime login, in that organization's
scope only."""

ERASE = """An operator's act for a person's right to erasure (docs/memory.md). It runs as the
schema owner (CONTEXTCORE_DATABASE_OWNER_URL) and prints what matches: a user's memories and
every memory about them, a subject's, or one memory's whole chain. With --apply it removes their
text and keeps the record; without, it is a dry run that changes nothing."""

ORGANIZATION = "7b000000-0000-4000-8000-0000000000a1"
MAX_DAYS = 36_500
"""The longest window ``--days`` takes: a century, well inside a timestamp's range."""


async def _health(args: argparse.Namespace) -> int:
    settings = DatabaseSettings()
    pool = await create_pool(
        settings.require_url(), timeout_s=settings.connect_timeout_s, max_size=1
    )
    try:
        report = await health(
            TenantDatabase(pool, role=settings.role), args.organization, timedelta(days=args.days)
        )
    finally:
        await pool.close()
    print(f"organization {report.organization_id}")
    print(f"chains: {report.chains}, live: {report.live_chains}")
    lengths = ", ".join(f"{n} revisions: {c}" for n, c in report.chain_lengths.items())
    print(f"chain lengths: {lengths or 'none'}")
    print(f"write calls in the last {args.days} days:")
    for key, calls in report.calls.items():
        print(f"  {key}: {calls}")
    rate = report.refusal_rate
    print(f"refusal rate: {'n/a' if rate is None else f'{rate:.1%}'}")
    drops = ", ".join(f"{reason}: {n}" for reason, n in report.dropped_at_read.items())
    print(f"live memories the memory source drops at read: {drops or 'none'}")
    return 0


async def _erase(args: argparse.Namespace) -> int:
    selector: Selector
    if args.user is not None:
        selector, selected = "user", str(args.user)
    elif args.subject is not None:
        selector, selected = "subject", args.subject
    else:
        selector, selected = "memory", str(args.memory)
    settings = DatabaseSettings()
    conn = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
    try:
        done = await erase(conn, args.organization, selector, selected, apply=args.apply)
    finally:
        await conn.close()
    verb = "erased" if done.erasure_id is not None else "would erase"
    print(f"organization {args.organization}, {selector} {selected}")
    print(
        f"{verb}: {done.revisions} revisions of {done.chains} chains,"
        f" {done.journal_rows} journal rows"
    )
    for memory_id in done.memory_ids:
        print(f"  {memory_id}")
    if done.erasure_id is not None:
        print(f"erasure record {done.erasure_id}")
    elif done.revisions and not args.apply:
        print("a dry run: nothing was changed; add --apply to erase")
    return 0


def health_command(argv: list[str]) -> int:
    """One organization's memory health."""
    parser = command_parser(
        "memory health", HEALTH, f"contextcore memory health --organization {ORGANIZATION}"
    )
    parser.add_argument("--organization", type=UUID, required=True)
    parser.add_argument(
        "--days", type=whole(1, MAX_DAYS), default=30, help="the window of write calls (30)"
    )
    args = parser.parse_args(argv)
    return run_command(
        "contextcore memory health",
        lambda: asyncio.run(_health(args)),
        expected=(ValueError, asyncpg.PostgresError),
    )


def erase_command(argv: list[str]) -> int:
    """Erase a person's or a subject's memory text (an operator's act)."""
    parser = command_parser(
        "memory erase",
        ERASE,
        f"contextcore memory erase --organization {ORGANIZATION} --subject crm.company:42",
        f"contextcore memory erase --organization {ORGANIZATION} --subject crm.company:42 --apply",
    )
    parser.add_argument("--organization", type=UUID, required=True)
    matched = parser.add_mutually_exclusive_group(required=True)
    matched.add_argument("--user", type=UUID, help="their memories and every memory about them")
    matched.add_argument(
        "--subject", type=subject_selector, help="KIND:ID: every memory about this row"
    )
    matched.add_argument("--memory", type=UUID, help="the whole chain of this revision")
    parser.add_argument("--apply", action="store_true", help="erase (default: a dry run)")
    args = parser.parse_args(argv)
    return run_command(
        "contextcore memory erase",
        lambda: asyncio.run(_erase(args)),
        expected=(ValueError, asyncpg.PostgresError),
    )
