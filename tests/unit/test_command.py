"""The one command line (producers/command.py): its subcommands found through entry points, the
global options, help written for a terminal, and exit statuses that tell a usage error, a
refusal and an unavailable service apart."""

from __future__ import annotations

import os
import re
from importlib.metadata import EntryPoint

import pytest

from producers import command
from producers.knowledge import DocumentTooLarge
from schemas.errors import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigurationError,
    InfrastructureUnavailable,
    PublishFailed,
    ReplyTimeout,
    RequestRefused,
    SchemaError,
    exit_code,
)

CLIENT = {"build", "upload", "memory"}
"""What the client distribution brings (packaging/client/pyproject.toml)."""
EXPECTED = CLIENT | {
    "knowledge",
    "serve",
    "policy",
    "schema",
    "memory.health",
    "memory.erase",
    "quota",
    "dev",
}

seen: list[tuple[list[str], str | None]] = []


def echo(argv: list[str]) -> int:
    """Record what the command was given."""
    seen.append((argv, os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS")))
    return 7


def test_every_command_is_installed_under_the_one_cli() -> None:
    assert set(command.commands()) == EXPECTED


def test_the_global_options_go_first_and_become_settings() -> None:
    assert command.split(["--bootstrap-servers", "k:9092", "build", "a", "--timeout", "3"]) == (
        {"CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": "k:9092"},
        "build",
        ["a", "--timeout", "3"],
    )
    assert command.split(["--database-url=postgresql://x", "serve", "build"]) == (
        {"CONTEXTCORE_DATABASE_URL": "postgresql://x"},
        "serve",
        ["build"],
    )
    assert command.split(["build", "--help"]) == ({}, "build", ["--help"])
    assert command.split(["--help"]) == ({}, None, [])
    assert command.split(["--", "build", "-x"]) == ({}, "build", ["-x"])
    for wrong in (["--bootstrap-servers"], ["--bootstrap-servers", "-x"], ["--database-url="]):
        with pytest.raises(ValueError, match="needs a value"):
            command.split(wrong)
    with pytest.raises(ValueError, match="unknown global option --verbose"):
        command.split(["--verbose", "build"])


def test_a_command_runs_with_the_global_settings_and_its_own_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS", "before")  # restored after
    fake = EntryPoint("echo", f"{__name__}:echo", command.GROUP)
    monkeypatch.setattr(command, "commands", lambda: {"echo": fake})
    seen.clear()
    assert command.main(["--bootstrap-servers", "k:1", "echo", "x", "--y"]) == 7
    assert seen == [(["x", "--y"], "k:1")]


def other(argv: list[str]) -> int:
    seen.append((["other", *argv], None))
    return 8


def test_a_distribution_adds_a_subcommand_to_a_command_another_owns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    points = {
        "memory": EntryPoint("memory", f"{__name__}:echo", command.GROUP),
        "memory.health": EntryPoint("memory.health", f"{__name__}:other", command.GROUP),
    }
    monkeypatch.setattr(command, "commands", lambda: points)
    seen.clear()
    assert command.main(["memory", "health", "--days", "3"]) == 8
    assert command.main(["memory", "remember", "--text", "x"]) == 7
    assert command.main(["memory"]) == 7
    assert [argv for argv, _ in seen] == [
        ["other", "--days", "3"],
        ["remember", "--text", "x"],
        [],
    ]


def test_a_command_of_another_distribution_says_where_it_comes_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client_only = {name: point for name, point in command.commands().items() if name in CLIENT}
    monkeypatch.setattr(command, "commands", lambda: client_only)
    assert command.main(["serve", "build"]) == EXIT_USAGE
    assert "comes with the service distribution" in capsys.readouterr().err
    assert command.main(["memory", "erase", "--organization", "x"]) == EXIT_USAGE
    assert "'memory erase' comes with the service distribution" in capsys.readouterr().err
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "  serve " not in out  # not listed
    assert "contextcore --bootstrap-servers kafka:9092 serve" not in out  # nor an example
    assert "contextcore build request.json" in out


def test_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["no-such-command"]) == EXIT_USAGE
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("contextcore: no command 'no-such-command' (commands: build, dev, ")
    assert command.main(["--nope", "build"]) == EXIT_USAGE
    assert command.main([]) == EXIT_USAGE  # no command: the help on stderr, a usage status
    assert "commands:" in capsys.readouterr().err
    assert command.main(["--bootstrap-servers", "k:1"]) == EXIT_USAGE
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error in a subcommand
        command.main(["build"])
    assert exited.value.code == EXIT_USAGE


def test_the_help_lists_every_command_with_a_line_of_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        shown = name.replace(".", " ")  # memory.health is `contextcore memory health`
        [line] = [line for line in out.splitlines() if re.match(f"  {shown}  +[A-Z]", line)]
        assert len(line.split(maxsplit=1)) == 2, line  # a summary beside the name
    assert "exit status:" in out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_commands_help_is_plain_text_with_an_example(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    words = name.split(".")
    with pytest.raises(SystemExit) as exited:
        command.main([*words, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    name = " ".join(words)
    assert out.startswith(f"usage: contextcore {name} ")
    assert "``" not in out  # no reStructuredText
    assert ":class:" not in out
    assert f"contextcore {name}" in out.split("example", 1)[1]
    assert "  3    unavailable" in out


def test_the_exit_status_tells_usage_refusal_and_unavailable_apart() -> None:
    assert exit_code(ConfigurationError("CONTEXTCORE_X is not set")) == EXIT_USAGE
    assert exit_code(InfrastructureUnavailable("no broker")) == EXIT_UNAVAILABLE
    assert exit_code(PublishFailed("not taken")) == EXIT_UNAVAILABLE
    assert exit_code(ReplyTimeout("no reply")) == EXIT_UNAVAILABLE
    assert exit_code(RequestRefused("invalid_request", "no")) == EXIT_REFUSED
    assert exit_code(DocumentTooLarge("too big")) == EXIT_REFUSED
    assert exit_code(SchemaError(["migration 00001 is pending"])) == EXIT_REFUSED
    assert exit_code(KeyboardInterrupt()) == 130
    assert exit_code(ConnectionRefusedError()) == EXIT_UNAVAILABLE  # an object store, say
    assert exit_code(FileNotFoundError()) == EXIT_REFUSED
    for sqlstate in ("08006", "57P03", "53300"):  # as asyncpg's errors carry it
        assert exit_code(type("PgError", (Exception,), {"sqlstate": sqlstate})()) == 3
    assert exit_code(type("PgError", (Exception,), {"sqlstate": "42501"})()) == EXIT_REFUSED
