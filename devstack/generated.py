"""A file generated from the code and committed: written by its command, or checked (``--check``)
in CI and by a test, so it cannot drift from what it is generated from."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class Main(Protocol):
    def __call__(self, argv: list[str] | None = None) -> int: ...


def generator_main(
    module: str, description: str | None, path: Path, generate: Callable[[], str]
) -> Main:
    """The ``main`` of ``python -m <module> [--check]``: write ``generate()`` to ``path``, or,
    with ``--check``, exit 1 when the committed file differs."""

    def main(argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
        parser.add_argument("--check", action="store_true", help="compare instead of writing")
        args = parser.parse_args(argv)
        text = generate()
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is stale: run python -m {module}", file=sys.stderr)
                return 1
            return 0
        path.write_text(text)
        print(f"wrote {path} ({len(text.splitlines())} lines)")
        return 0

    return main
