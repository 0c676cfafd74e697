"""``contextcore``: the one command line. Each subcommand is an entry point of the group
``contextcore.commands``, found at run time, so each distribution brings its own: the client
(packaging/client) its commands in ``producers/`` (build, upload, memory), the service
(pyproject.toml) the consumers' (serve, policy) and the operator's in ``admin/`` (schema,
knowledge, memory health, memory erase, quota), the dev tools (packaging/devstack) ``dev``. None
imports another's. An entry point ``NAME.SUB`` adds ``contextcore NAME SUB`` to a command that
another distribution owns (the service's ``memory.health`` beside the client's ``memory``).

The global options come before the command and become the settings every command reads from its
environment, so each command takes them alike.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points

from schemas.errors import EXIT_STATUS, EXIT_USAGE

GROUP = "contextcore.commands"

Main = Callable[[list[str]], int]

# option -> the setting it sets
GLOBALS = {
    "--bootstrap-servers": "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS",
    "--database-url": "CONTEXTCORE_DATABASE_URL",
}

DESCRIPTION = """The context service for LLM agents: build briefs, upload documents, remember
facts, run the consumers, manage the schema.

usage: contextcore [global options] [--] COMMAND [arguments]
       contextcore COMMAND --help      the command's own options, with an example

global options (before the command; each sets the setting named):
  --bootstrap-servers HOST:PORT    the Kafka broker (CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS)
  --database-url URL               the runtime login (CONTEXTCORE_DATABASE_URL; prefer the
                                   variable: a password on the command line is visible to ps)
  -h, --help                       this help

every other setting is read from its CONTEXTCORE_* variable (docs/operations.md)."""

EXAMPLES = {
    "dev": "contextcore dev up",
    "build": "contextcore build request.json policy.json",
    "serve": "contextcore --bootstrap-servers kafka:9092 serve build",
}
"""One example per command, shown when that command is installed."""

ELSEWHERE = {
    "dev": "comes with a checkout of the repository (scripts/bootstrap installs it)",
    "serve": "comes with the service distribution, contextcore",
    "schema": "comes with the service distribution, contextcore",
    "knowledge": "comes with the service distribution, contextcore",
    "policy": "comes with the service distribution, contextcore",
    "memory.health": "comes with the service distribution, contextcore",
    "memory.erase": "comes with the service distribution, contextcore",
    "quota": "comes with the service distribution, contextcore",
}
"""Where a command that is not installed here comes from."""


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, finite and above 0. Anything else is the command
    line's mistake, refused as one (usage, exit 2): a timeout of -1 used to wait for nothing
    and exit 3, as if the service had not answered."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``, when given). A number out of
    range is the command line's mistake (usage, exit 2), not a refusal of the service (1)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise argparse.ArgumentTypeError(f"must be a whole number {bounds}, not {text!r}")
        return value

    return parse


def commands() -> dict[str, EntryPoint]:
    """Every installed subcommand, by name."""
    return {point.name: point for point in entry_points(group=GROUP)}


def summary(point: EntryPoint) -> str:
    """The first line of the command's docstring; why it cannot load, when it cannot."""
    try:
        run: Main = point.load()
    except Exception as error:  # a broken install: the help still lists the rest
        return f"(not available here: {type(error).__name__}: {error})"
    lines = (run.__doc__ or "").strip().splitlines()
    return lines[0] if lines else ""


def help_text(found: dict[str, EntryPoint]) -> str:
    width = max((len(name) for name in found), default=0) + 4
    lines = [f"  {name.replace('.', ' '):<{width}}{summary(found[name])}" for name in sorted(found)]
    examples = [f"  {line}" for name, line in EXAMPLES.items() if name in found]
    parts = [DESCRIPTION, "commands:\n" + "\n".join(lines)]
    if examples:
        parts.append("examples:\n" + "\n".join(examples))
    return "\n\n".join([*parts, EXIT_STATUS])


def split(argv: Sequence[str]) -> tuple[dict[str, str], str | None, list[str]]:
    """``[global options] [--] COMMAND [arguments]`` as (settings, command, its arguments);
    no command when the help is asked for, or none is given.

    Raises:
        ValueError: a global option without its value, or an option that is not one.
    """
    settings: dict[str, str] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        if argv[index] == "--":
            index += 1
            break
        option, has_value, value = argv[index].partition("=")
        if argv[index] in ("-h", "--help"):
            return settings, None, []
        if option not in GLOBALS:
            raise ValueError(f"unknown global option {option} (global options go first)")
        if not has_value:
            index += 1
            if index == len(argv) or argv[index].startswith("-"):
                raise ValueError(f"{option} needs a value")
            value = argv[index]
        if not value:
            raise ValueError(f"{option} needs a value")
        settings[GLOBALS[option]] = value
        index += 1
    if index == len(argv):
        return settings, None, []
    return settings, argv[index], list(argv[index + 1 :])


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    found = commands()
    try:
        settings, name, rest = split(args)
    except ValueError as error:
        print(f"contextcore: {error}; see contextcore --help", file=sys.stderr)
        return EXIT_USAGE
    if name is None:
        if any(arg in ("-h", "--help") for arg in args):
            print(help_text(found))
            return 0
        print(help_text(found), file=sys.stderr)  # no command: a usage error, with the help
        return EXIT_USAGE
    sub = f"{name}.{rest[0]}" if rest else ""
    if sub in found or sub in ELSEWHERE:  # a subcommand another distribution adds
        name, rest = sub, rest[1:]
    point = found.get(name)
    if point is None:
        shown = name.replace(".", " ")
        known = ", ".join(sorted(n.replace(".", " ") for n in found)) or "none installed"
        print(f"contextcore: no command {shown!r} (commands: {known})", file=sys.stderr)
        if name in ELSEWHERE:
            print(f"contextcore: {shown!r} {ELSEWHERE[name]}", file=sys.stderr)
        return EXIT_USAGE
    run: Main = point.load()
    os.environ.update(settings)
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
