"""``contextcore memory``: agent memory from the command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import timedelta
from uuid import UUID

import asyncpg

from broker.settings import KafkaSettings, TopicSettings
from contextcore.errors import RequestRefused, command_parser, run_command
from contextcore.memory.erasure import Selector, erase, subject_selector
from contextcore.memory.health import health
from contextcore.memory.models import Invoker, MemoryCandidate, MemorySubjectRef
from contextcore.settings import DatabaseSettings
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.tenancy import TenantDatabase
from producers.memory import MemoryClient
from schemas.memory import MemoryAnswerV1


def _invoker(args: argparse.Namespace) -> Invoker:
    return Invoker(
        organization_id=args.organization,
        definition_id=args.definition,
        user_id=args.user,
        trigger_id=args.trigger,
        run_id=getattr(args, "run", None),
    )


def _answered(answer: MemoryAnswerV1) -> int:
    print(answer.model_dump_json(indent=2))
    if answer.status == "refused":
        raise RequestRefused(answer.reason or "refused", answer.message or "refused")
    return 0


async def _remember(args: argparse.Namespace) -> int:
    refs = []
    if args.ref:
        kind, _, row_id = args.ref.partition(":")
        refs.append(MemorySubjectRef(kind=kind, id=row_id))
    candidate = MemoryCandidate(
        scope=args.scope, attribute=args.attribute, text=args.text, subject_refs=refs
    )
    async with MemoryClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        answer = await client.remember(
            _invoker(args), candidate, idempotency_key=args.idempotency_key
        )
    return _answered(answer)


async def _forget(args: argparse.Namespace) -> int:
    async with MemoryClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        answer = await client.forget(
            _invoker(args), args.memory_id, idempotency_key=args.idempotency_key
        )
    return _answered(answer)


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


def _principal(command: argparse.ArgumentParser) -> None:
    command.add_argument("--organization", type=UUID, required=True)
    command.add_argument("--definition", type=UUID, required=True, help="the owning agent")
    actor = command.add_mutually_exclusive_group(required=True)
    actor.add_argument("--user", type=UUID)
    actor.add_argument("--trigger", type=UUID)
    command.add_argument("--idempotency-key", help="default: a fresh one")


MEMORY = """Agent memory from the command line.

  remember --organization ID --definition ID (--user ID | --trigger ID)
           --scope user|organization --attribute preference.x --text TEXT
           [--ref KIND:ID] [--run ID] [--idempotency-key K]
                  store a memory, as an agent's memory.remember does
  forget   --organization ID --definition ID (--user ID | --trigger ID) MEMORY_ID
                  forget a live memory (memory.forget)
  health   --organization ID [--days 30]
                  one organization's memory: live chains, chain lengths, refusals
  erase    --organization ID (--user ID | --subject KIND:ID | --memory ID) [--apply]
                  an operator's act for a person's right to erasure (docs/memory.md)

remember and forget go over the memory-write topic and print the answer as JSON; a refusal
exits 1. health reads one organization's memory as the runtime login, in its scope only.
erase runs as the schema owner (CONTEXTCORE_DATABASE_OWNER_URL): it prints what matches (a
user's memories and every memory about them, a subject's, or one memory's whole chain) and,
with --apply, removes their text and keeps the record."""


def main(argv: list[str] | None = None) -> int:
    """Remember, forget, memory health, erasure."""
    parser = command_parser(
        "memory",
        MEMORY,
        "contextcore memory health --organization 7b000000-0000-4000-8000-0000000000a1",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    remember = commands.add_parser("remember", help="store a memory (memory.remember)")
    _principal(remember)
    remember.add_argument("--scope", choices=["user", "organization"], required=True)
    remember.add_argument("--attribute", required=True, help="observation.* or preference.*")
    remember.add_argument("--text", required=True)
    remember.add_argument("--ref", help="KIND:ID of the row the memory is about")
    remember.add_argument("--run", type=UUID, help="the run that proposed it")
    forget = commands.add_parser("forget", help="forget a live memory (memory.forget)")
    _principal(forget)
    forget.add_argument("memory_id", type=UUID)
    report = commands.add_parser("health", help="one organization's memory health")
    report.add_argument("--organization", type=UUID, required=True)
    report.add_argument("--days", type=int, default=30, help="the window of write calls (30)")
    eraser = commands.add_parser(
        "erase", help="erase a person's or a subject's memory text (an operator's act)"
    )
    eraser.add_argument("--organization", type=UUID, required=True)
    matched = eraser.add_mutually_exclusive_group(required=True)
    matched.add_argument("--user", type=UUID, help="their memories and every memory about them")
    matched.add_argument(
        "--subject", type=subject_selector, help="KIND:ID: every memory about this row"
    )
    matched.add_argument("--memory", type=UUID, help="the whole chain of this revision")
    eraser.add_argument("--apply", action="store_true", help="erase (default: a dry run)")
    args = parser.parse_args(argv)
    run = {"remember": _remember, "forget": _forget, "health": _health, "erase": _erase}[
        args.command
    ]
    return run_command(
        "contextcore memory",
        lambda: asyncio.run(run(args)),
        expected=(ValueError, asyncpg.PostgresError),
    )


if __name__ == "__main__":
    sys.exit(main())
