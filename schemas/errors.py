"""The one exception root of contextcore, and the one mapping from an error to an exit status.

    ContextcoreError
    ├── ConfigurationError          a required setting is missing or malformed           exit 2
    ├── InfrastructureUnavailable   a broker or database cannot be reached               exit 3
    ├── SchemaError                 the database schema does not match the migrations    exit 1
    │   ├── MigrationFileError      the migration files themselves are malformed
    │   └── MigrationFailed         PostgreSQL refused a migration
    ├── PolicyError (ValueError)    a context policy fails admission                     exit 1
    ├── RequiredContextSourceError  a required source failed; the run must fail          exit 1
    ├── SourceFailure               why one source gave no items (the builder's own)
    ├── WireError (ValueError)      a record is not JSON the service accepts
    ├── PublishError                the broker did not take a record (the runtime's)
    ├── ExtractionError             a document cannot become text
    ├── ObjectError                 an object cannot be read, for good
    ├── ObjectUnavailable           the object store did not answer: retry later
    ├── ModelUnavailable (LookupError)  a scope's live model is not one this process has
    ├── ModelMoved                  a scope's live model flipped mid-search: search again
    ├── UnknownModel (LookupError)  a batch names a model this process does not encode with
    ├── BatchRefused                the store will never take an embedding batch
    ├── NoSuchOrganization          an upload names an organization the database does not hold
    ├── Unstorable                  a document's chunks cannot be carried to the embedding group
    ├── MemoryContention            a memory write lost its chain's head too often
    ├── JournalRefused              the memory journal refused a transaction whole
    │   ├── ConstraintBroken        ... for a rule no retry changes
    │   ├── LostTheRace             ... for a chain's head, too often
    │   └── WrittenConcurrently     ... for a writer of the same key that committed
    ├── Refused                     an admin command may not run now                     exit 1
    └── ClientError                 a client call got no usable answer (producers/)
        ├── PublishFailed (InfrastructureUnavailable)  the broker did not take it        exit 3
        ├── ReplyTimeout            no reply within the timeout                          exit 3
        ├── DocumentTooLarge (ValueError)  a file does not fit one record                exit 1
        └── RequestRefused          the service answered with an error reply             exit 1
            ├── BuildFailed         ... to a build request (producers/client.py)
            └── UploadFailed        ... to an upload, or its source failed (producers/knowledge.py)
                └── UploadSuperseded    a later upload of the same document replaced it

Where they live: ``SourceFailure`` contextcore/builder.py, ``WireError`` schemas/wire.py,
``PublishError`` consumers/runtime/delivery.py, ``ExtractionError`` contextcore/knowledge/
extract.py, ``ObjectError`` and ``ObjectUnavailable`` contextcore/knowledge/addresses.py,
``ModelUnavailable`` and ``ModelMoved`` contextcore/knowledge/search.py, ``UnknownModel``
contextcore/knowledge/embed.py, ``BatchRefused`` contextcore/knowledge/embed.py,
``NoSuchOrganization`` contextcore/knowledge/ingest.py, ``Unstorable``
consumers/knowledge/upload/handler.py, ``MemoryContention`` and ``JournalRefused`` with its three
contextcore/memory/service.py, ``Refused`` admin/knowledge.py, ``DocumentTooLarge``
producers/knowledge.py, the rest here.
(``_Died`` in contextcore/knowledge/sandbox.py, private to its module, is one too.) A test
(tests/unit/test_errors.py) checks that every exception class the packages define is drawn
here and derives from the root.

Every error carries a message that fits on one line: each command-line entry point runs through
:func:`run_command`, which prints ``<prog>: <message>`` (one line per problem of a
``SchemaError``) and returns :func:`exit_code`. Never a traceback for an error we expect.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError


class ContextcoreError(Exception):
    """Root of every error contextcore raises on purpose."""


class ConfigurationError(ContextcoreError):
    """A required setting is missing or malformed."""


class InfrastructureUnavailable(ContextcoreError):
    """A broker or database did not answer in time."""


class SchemaError(ContextcoreError):
    """The database schema does not match the migrations this code ships.

    Attributes:
        problems: one line per mismatch (pending, unknown or tampered migration).
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class MigrationFileError(SchemaError):
    """A migration file is misnamed, duplicated or out of order."""


class MigrationFailed(SchemaError):
    """PostgreSQL refused a migration; nothing of that migration was applied."""


class PolicyError(ContextcoreError, ValueError):
    """A policy fails admission. ``path`` names the field, e.g. ``sources[1].token_budget``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


class RequiredContextSourceError(ContextcoreError):
    """Required sources failed; the run must fail. ``sources`` keeps policy order."""

    def __init__(self, sources: Sequence[str], reasons: Sequence[str]) -> None:
        self.sources = list(sources)
        self.reasons = list(reasons)
        detail = "; ".join(f"{s}: {r}" for s, r in zip(self.sources, self.reasons, strict=True))
        super().__init__(f"required context sources failed: {detail}")


class ClientError(ContextcoreError):
    """A client call did not get the answer it asked for."""


class PublishFailed(ClientError, InfrastructureUnavailable):
    """The broker did not take the request (it timed out, or refused it): it was not sent, or
    whether it was is unknown. Sending it again is safe: requests are idempotent by key."""


class ReplyTimeout(ClientError):
    """No reply arrived in time; the request may still be answered later (and ignored)."""


class RequestRefused(ClientError):
    """The service answered with an error reply: ``code`` is machine-readable."""

    def __init__(self, code: str, message: str, details: Sequence[str] = ()) -> None:
        self.code = code
        self.details = list(details)
        suffix = f" ({'; '.join(self.details)})" if self.details else ""
        super().__init__(f"{code}: {message}{suffix}")


def field_path(location: Sequence[int | str]) -> str:
    """A pydantic error location as a dotted path (``policy.sources.0.name``)."""
    return ".".join(str(part) for part in location)


def validation_lines(error: ValidationError) -> list[str]:
    """One ``path: message`` line per problem, for replies and command-line errors."""
    return [f"{field_path(e['loc']) or '<root>'}: {e['msg']}" for e in error.errors()]


EXIT_OK = 0
EXIT_REFUSED = 1
"""The input or the service said no: an invalid file, an error reply, a schema mismatch."""
EXIT_USAGE = 2
"""The command cannot run as given: a usage error (argparse's own 2) or a missing setting."""
EXIT_UNAVAILABLE = 3
"""The service could not be asked: the broker or database unreachable, no reply in time."""
EXIT_INTERRUPTED = 130

EXIT_STATUS = f"""exit status:
  {EXIT_OK}    done
  {EXIT_REFUSED}    refused: invalid input, an error reply, a schema that does not match
  {EXIT_USAGE}    usage: a wrong command line, or a setting missing or malformed
  {EXIT_UNAVAILABLE}    unavailable: the broker or the database unreachable, no reply in time"""
"""The epilog every command's help ends with."""


_UNAVAILABLE_SQLSTATES = frozenset({"53300", "57P01", "57P02", "57P03"})
"""too_many_connections, admin_shutdown, crash_shutdown, cannot_connect_now: the database is
there but will not take this command now (asyncpg's errors carry the code as ``sqlstate``)."""


def exit_code(error: BaseException) -> int:
    """The exit status for ``error``: a script can tell a refusal (retrying will not help)
    from an unavailable service (retrying later may) and from its own wrong invocation."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, InfrastructureUnavailable | ReplyTimeout | ConnectionError | TimeoutError):
        return EXIT_UNAVAILABLE
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and (
        sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES
    ):  # PostgreSQL's connection exceptions (class 08) and the codes above
        return EXIT_UNAVAILABLE
    if isinstance(error, ConfigurationError):
        return EXIT_USAGE
    return EXIT_REFUSED


def error_lines(error: BaseException) -> list[str]:
    """What a command prints for ``error``: one line, or one per problem."""
    if isinstance(error, SchemaError):
        return list(error.problems)
    if isinstance(error, ValidationError):
        return [f"invalid input: {line}" for line in validation_lines(error)]
    text = str(error).strip() or type(error).__name__
    return [text.splitlines()[0]]


def run_command(
    prog: str, body: Callable[[], int], *, expected: tuple[type[BaseException], ...] = ()
) -> int:
    """Run a command's body and turn every expected error into lines on stderr and a status.

    ``expected`` names further error types the command reports the same way (``OSError`` for a
    file it reads, the database driver's error for a command that runs SQL).
    """
    reported: tuple[type[BaseException], ...] = (ContextcoreError, ValidationError, *expected)
    try:
        return body()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except reported as error:
        for line in error_lines(error):
            print(f"{prog}: {line}", file=sys.stderr)
        return exit_code(error)


def command_parser(name: str, description: str, *examples: str) -> argparse.ArgumentParser:
    """The parser of ``contextcore NAME``: its text as written (lists stay lists), then its
    examples and the exit statuses."""
    shown = "\n".join(f"  {example}" for example in examples)
    return argparse.ArgumentParser(
        prog=f"contextcore {name}",
        description=description,
        epilog=f"{'examples' if len(examples) > 1 else 'example'}:\n{shown}\n\n{EXIT_STATUS}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
