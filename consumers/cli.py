"""``contextcore``: the consumers, and policy admission.

    contextcore serve build|memory|upload|embed|sweep  run a consumer until SIGTERM/SIGINT
    contextcore policy check FILE.json   admit a context policy as the build consumer would

A missing setting or an unreachable broker or database prints one line and exits 2; a schema
mismatch exits 1 (``contextcore.errors.exit_code``). The embedded dev stack and the demo are
``contextcore-dev`` (the ``devstack`` package, which production never imports).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from consumers.build.sources import process_registry
from contextcore.errors import run_command
from contextcore.models import ContextPolicy


def _check_policy(path: Path) -> int:
    """Admission of one policy file: exit 0 when admitted, 1 with the failing path otherwise."""
    policy = ContextPolicy.model_validate_json(path.read_bytes())
    process_registry().validate_policy(policy)
    print(f"{path}: admitted")
    return 0


def _serve(consumer: str) -> int:
    if consumer == "sweep":
        from consumers.sweep.app import serve

        asyncio.run(serve())
        return 0
    if consumer == "upload":
        from consumers.upload.app import create_app as create_upload

        app = create_upload()
    elif consumer == "embed":
        from consumers.embed.app import create_app as create_embed

        app = create_embed()
    elif consumer == "memory":
        from consumers.memory.app import create_app as create_memory

        app = create_memory()
    else:
        from consumers.build.app import create_app as create_build

        app = create_build()
    # FastStream's own start/stop lines at DEBUG: the consumer prints one ready line itself
    asyncio.run(app.app.run(log_level=logging.DEBUG))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="contextcore",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a consumer")
    serve.add_argument("consumer", choices=["build", "memory", "upload", "embed", "sweep"])
    policy = commands.add_parser("policy", help="check a context policy file")
    policy.add_argument("action", choices=["check"])
    policy.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "policy":
        return run_command(str(args.file), lambda: _check_policy(args.file), expected=(OSError,))
    return run_command("contextcore", lambda: _serve(args.consumer))


if __name__ == "__main__":
    sys.exit(main())
