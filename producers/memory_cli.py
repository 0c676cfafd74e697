"""``contextcore memory``: agent memory from the command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from uuid import UUID

from broker.settings import KafkaSettings, TopicSettings
from producers.memory import MemoryClient
from schemas.errors import RequestRefused, command_parser, run_command
from schemas.memory import Invoker, MemoryAnswerV1, MemoryCandidate, MemorySubjectRef


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

Both go over the memory-write topic and print the answer as JSON; a refusal exits 1.
The service distribution adds `contextcore memory health` and `contextcore memory erase`,
which read the database (each has its own --help)."""


def main(argv: list[str] | None = None) -> int:
    """Remember and forget, over the memory-write topic."""
    parser = command_parser(
        "memory",
        MEMORY,
        "contextcore memory forget --organization 7b000000-0000-4000-8000-0000000000a1"
        " --definition 7b000000-0000-4000-8000-0000000000d1"
        " --user 7b000000-0000-4000-8000-0000000000b1 MEMORY_ID",
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
    args = parser.parse_args(argv)
    run = {"remember": _remember, "forget": _forget}[args.command]
    return run_command(
        "contextcore memory",
        lambda: asyncio.run(run(args)),
        expected=(ValueError,),
    )


if __name__ == "__main__":
    sys.exit(main())
