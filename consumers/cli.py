"""``contextcore``: the embedded dev stack, the consumers, and the demo.

    contextcore dev up|down|status|env   the embedded broker + PostgreSQL on 127.0.0.1
    contextcore serve build              run the build consumer until SIGTERM/SIGINT
    contextcore demo [--serve]           the main job end to end on the embedded default
    contextcore policy check FILE.json   admit a context policy as the build consumer would

Every failure to reach the broker or the database, and every missing setting, prints one line
and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from consumers.demo import run_demo
from consumers.devstack import DevStack
from consumers.serve import serve_build
from consumers.sources import process_registry
from consumers.topics import all_topics
from contextcore.errors import ContextcoreError, SchemaError, validation_lines
from contextcore.models import ContextPolicy
from contextcore.registry import PolicyError
from contextcore.settings import Settings


async def _dev(action: str) -> int:
    stack = DevStack()
    if action == "up":
        report = await stack.up(all_topics(Settings()))
        print("\n".join(report.lines(stack.home)))
    elif action == "down":
        broker, postgres = await asyncio.to_thread(stack.down)
        print(
            f"broker {'stopped' if broker else 'was not running'}; "
            f"postgres {'stopped' if postgres else 'was not running'}"
        )
    elif action == "status":
        broker, postgres = stack.status()
        print(f"broker {'up' if broker else 'down'}; postgres {'up' if postgres else 'down'}")
        return 0 if broker and postgres else 1
    else:
        print(stack.addresses.exports())
    return 0


def _check_policy(path: Path) -> int:
    """Admission of one policy file: exit 0 when admitted, 1 with the failing path otherwise."""
    try:
        policy = ContextPolicy.model_validate_json(path.read_bytes())
        process_registry().validate_policy(policy)
    except ValidationError as error:
        for line in validation_lines(error):
            print(f"{path}: {line}", file=sys.stderr)
        return 1
    except PolicyError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"{path}: admitted")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="contextcore",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="the embedded broker + PostgreSQL")
    dev.add_argument("action", choices=["up", "down", "status", "env"])
    serve = commands.add_parser("serve", help="run a consumer")
    serve.add_argument("consumer", choices=["build"])
    demo = commands.add_parser("demo", help="start everything and answer one demo request")
    demo.add_argument("--serve", action="store_true", help="keep the consumer running afterwards")
    policy = commands.add_parser("policy", help="check a context policy file")
    policy.add_argument("action", choices=["check"])
    policy.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "policy":
            return _check_policy(args.file)
        if args.command == "dev":
            return asyncio.run(_dev(args.action))
        if args.command == "serve":
            asyncio.run(serve_build(Settings()))
            return 0
        return asyncio.run(run_demo(args.serve))
    except SchemaError as error:
        for problem in error.problems:
            print(f"contextcore: refusing to serve: {problem}", file=sys.stderr)
        return 1
    except ContextcoreError as error:
        print(f"contextcore: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
