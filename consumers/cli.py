"""The service's commands: ``contextcore serve`` and ``contextcore policy``.

``python -m consumers.cli serve build`` runs the same as ``contextcore serve build`` (the benches
and tests start consumers that way, with no console script needed).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from consumers.runtime import logs
from schemas.errors import EXIT_USAGE, command_parser, run_command

CONSUMERS = ("build", "memory", "upload", "embed", "sweep")

SERVE = """Run one consumer until SIGTERM or SIGINT.

  build     the build-request topic: briefs, on each request's reply topic
  memory    the memory-write topic: memory.remember and memory.forget
  upload    the upload topic: extract, chunk, hand batches to the embedding group
  embed     the embedding group: embed the batches, mark the sources ready
  sweep     fail sources pending over an hour; prune the ledger and the start journal

Settings come from CONTEXTCORE_* variables (docs/operations.md). The consumer refuses to start
while the database schema does not match the code (run contextcore schema init first)."""

POLICY = """Admit a context policy as the build consumer would, without any service.

  check FILE.json    prints "FILE.json: admitted", or the failing field and why"""


def _check_policy(path: Path) -> int:
    from consumers.build.sources import process_registry
    from schemas.context import ContextPolicy

    policy = ContextPolicy.model_validate_json(path.read_bytes())
    process_registry().validate_policy(policy)
    print(f"{path}: admitted")
    return 0


def _serve(consumer: str) -> int:
    from broker.settings import KafkaSettings
    from contextcore.storage.settings import DatabaseSettings

    # Every consumer needs both, and each group is read (a malformed one refused) when its app
    # is made: a setting missing or malformed exits 2 before anything connects, never 3 for
    # whichever of the broker or the database the consumer happens to reach first.
    KafkaSettings().require_bootstrap_servers()
    DatabaseSettings().require_url()
    if consumer == "sweep":
        from consumers.knowledge.sweep.app import serve as serve_sweep

        asyncio.run(serve_sweep())
        return 0
    if consumer == "upload":
        from consumers.knowledge.upload.app import create_app as create_upload

        app = create_upload()
    elif consumer == "embed":
        from consumers.knowledge.embed.app import create_app as create_embed

        app = create_embed()
    elif consumer == "memory":
        from consumers.memory.app import create_app as create_memory

        app = create_memory()
    else:
        from consumers.build.app import create_app as create_build

        app = create_build()
    asyncio.run(app.run())
    return 0


def serve(argv: list[str]) -> int:
    """Run a consumer (build, memory, upload, embed, sweep)."""
    parser = command_parser("serve", SERVE, "contextcore serve build")
    parser.add_argument("consumer", choices=CONSUMERS)
    args = parser.parse_args(argv)
    logs.configure(logging.WARNING)  # JSON lines unless stderr is a terminal
    return run_command("contextcore serve", lambda: _serve(args.consumer))


def policy(argv: list[str]) -> int:
    """Check a context policy file."""
    parser = command_parser("policy", POLICY, "contextcore policy check policy.json")
    parser.add_argument("action", choices=["check"])
    parser.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    return run_command(str(args.file), lambda: _check_policy(args.file), expected=(OSError,))


def main(argv: list[str] | None = None) -> int:
    """``serve ...`` or ``policy ...``, as ``contextcore`` would run them."""
    args = sys.argv[1:] if argv is None else argv
    commands = {"serve": serve, "policy": policy}
    if not args or args[0] not in commands:
        print("usage: python -m consumers.cli serve|policy ...", file=sys.stderr)
        return EXIT_USAGE
    return commands[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
