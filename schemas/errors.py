"""The one exception root of contextcore, and the one mapping from an error to an exit status.

    ContextcoreError
    ├── ConfigurationError          a setting is missing, malformed or refused           exit 2
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
    ├── UploadRefused               the database refuses to open an upload, for good
    │   ├── NoSuchOrganization      ... it names an organization the database does not hold
    │   └── OverQuota               ... or a quota of the organization refuses it
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
        │   └── ClientClosed        ... the client closed while the call waited
        ├── DocumentTooLarge (ValueError)  a file does not fit one record                exit 1
        └── RequestRefused          the service answered with an error reply             exit 1
            ├── BuildFailed         ... to a build request (producers/client.py)
            └── UploadFailed        ... to an upload, or its source failed (producers/knowledge.py)
                └── UploadSuperseded    a later upload of the same document replaced it

Where they live: ``SourceFailure`` contextcore/builder.py, ``WireError`` schemas/wire.py,
``PublishError`` consumers/runtime/transport.py, ``ExtractionError`` contextcore/knowledge/
extract.py, ``ObjectError`` and ``ObjectUnavailable`` contextcore/knowledge/addresses.py,
``ModelUnavailable`` and ``ModelMoved`` contextcore/knowledge/adapters/search.py, ``UnknownModel``
contextcore/knowledge/embed.py, ``BatchRefused`` contextcore/knowledge/embed.py,
``UploadRefused``, ``NoSuchOrganization`` and ``OverQuota`` contextcore/knowledge/ingest.py,
``Unstorable`` consumers/knowledge/upload/handler.py, ``MemoryContention`` and
``JournalRefused`` with its three contextcore/memory/service.py, ``Refused`` admin/knowledge.py,
``DocumentTooLarge`` producers/knowledge.py, the rest here.
(``_Died`` in contextcore/knowledge/adapters/sandbox.py, private to its module, is one too.) A test
(tests/unit/test_errors.py) checks that every exception class the packages define is drawn
here and derives from the root.

Every error carries a message that fits on one line: each command-line entry point runs through
:func:`run_command`, which prints ``<prog>: <message>`` (one line per problem of a
``SchemaError``) and returns :func:`exit_code`. Never a traceback for an error we expect.

A settings group that cannot be read from the environment fails in pydantic-settings, with its
``ValidationError`` (a value out of range, not a number, a rule between two values) or its
``SettingsError`` (a JSON value that does not parse), never one of ours: :func:`setting_error`
turns either into the ``ConfigurationError`` it stands for, one line naming each variable at
fault, so a malformed setting exits 2 as a missing one does. A ``ValidationError`` of any other
model is invalid input (exit 1): a request, a policy, a reply.

A setting well-formed but refused by what it names exits 2 as well, since no retry mends it:
the database's login or database (:mod:`contextcore.storage.pool` names the variable; a
driver's error that reaches a command unnamed still maps by its SQLSTATE) and its role
(:mod:`contextcore.storage.tenancy`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails


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


class ClientClosed(ReplyTimeout):
    """The client closed while the call waited: no reply will reach it (the request may still
    be answered, to nobody)."""


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
"""The command cannot run as given: a usage error (argparse's own 2), or a setting missing,
malformed, or refused for good by what it names (a wrong password, no such database or role)."""
EXIT_UNAVAILABLE = 3
"""The service could not be asked: the broker or database unreachable, no reply in time."""
EXIT_INTERRUPTED = 130

EXIT_STATUS = f"""exit status:
  {EXIT_OK}    done
  {EXIT_REFUSED}    refused: invalid input, an error reply, a schema that does not match
  {EXIT_USAGE}    usage: a wrong command line, or a setting missing, malformed or refused
  {EXIT_UNAVAILABLE}    unavailable: the broker or the database unreachable, no reply in time"""
"""The epilog every command's help ends with."""


_UNAVAILABLE_SQLSTATES = frozenset({"53300", "57P01", "57P02", "57P03"})
"""too_many_connections, admin_shutdown, crash_shutdown, cannot_connect_now: the database is
there but will not take this command now (asyncpg's errors carry the code as ``sqlstate``)."""


_SETTING_SQLSTATES = frozenset({"28P01", "28000", "3D000"})
"""invalid_password, invalid_authorization_specification, invalid_catalog_name: the database
answered and refuses the login or has no such database. Retrying with the same URL never
passes: a setting to correct."""


def _login_refused(error: BaseException) -> bool:
    """A driver's error of :data:`_SETTING_SQLSTATES`: a command that connected without
    ``contextcore.storage.pool`` (which names the variable) still reports it in one line."""
    return getattr(error, "sqlstate", None) in _SETTING_SQLSTATES


def _settings_classes() -> list[type[BaseModel]]:
    """Every settings class imported so far (a class that raised an error has been): a model
    whose configuration has an environment prefix, as pydantic-settings' ``BaseSettings`` gives
    each. Found, not imported: the domain's logic imports this module, and no settings library
    (the import contracts, pyproject.toml)."""
    found: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [BaseModel]
    while todo:
        subclasses = todo.pop().__subclasses__()
        found.extend(sub for sub in subclasses if "env_prefix" in sub.model_config)
        todo.extend(subclasses)
    return found


def _is_settings_error(error: BaseException) -> bool:
    """pydantic-settings' ``SettingsError``: a value it could not decode (JSON), before any
    validation."""
    return isinstance(error, ValueError) and any(
        kind.__name__ == "SettingsError" and kind.__module__.startswith("pydantic_settings.")
        for kind in type(error).__mro__
    )


def _variable(settings: type[BaseModel], field: str | int) -> str:
    """The variable a field is read from: its group's prefix and its name (no field of ours has
    an alias)."""
    return f"{settings.model_config.get('env_prefix') or ''}{field}".upper()


_FIELD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
"""A field's name in a rule's message: a word with an underscore (``session_timeout_ms``), so
that English words are never taken for one-word fields (``model``)."""


def _setting_problem(settings: type[BaseModel], problem: ErrorDetails) -> str:
    """One problem of a settings group, in words that name its variable. Never the value: a
    database URL holds a password."""
    location = problem["loc"]
    context = problem.get("ctx") or {}
    if problem["type"] == "value_error" and "error" in context:
        message = str(context["error"])  # a validator's own words, without "Value error, "
    else:
        message = problem["msg"]
    if not location:  # a rule between fields: the fields it names, as their variables
        named = _FIELD.sub(
            lambda word: (
                _variable(settings, word[0]) if word[0] in settings.model_fields else word[0]
            ),
            message,
        )
        return named if named != message else f"{_variable(settings, '*')}: {message}"
    variable = _variable(settings, location[0])
    if problem["type"] == "missing":
        return f"{variable} is not set"
    inner = f" at {field_path(location[1:])}" if len(location) > 1 else ""
    return f"{variable} is malformed{inner}: {message}"


_UNPARSED = re.compile(r'error (?:parsing|getting) value for field "([^"]+)"')
"""How pydantic-settings' ``SettingsError`` names the field it could not decode."""


def _unparsed_variable(error: BaseException) -> str:
    """The variable a ``SettingsError`` is about: its field's, among those set (a field of that
    name in two groups, both set: either)."""
    named = _UNPARSED.search(str(error))
    if named is None:
        return "a setting"
    field = named.group(1)
    variables = sorted(
        {
            _variable(settings, field)
            for settings in _settings_classes()
            if field in settings.model_fields and _variable(settings, field) in os.environ
        }
    )
    return " or ".join(variables) or f"the setting {field}"


def setting_error(error: BaseException) -> ConfigurationError | None:
    """``error`` as the :class:`ConfigurationError` it stands for when a settings group could
    not be read; ``None`` for any other error, an invalid input among them.

    A ``ValidationError`` names its model (its ``title``); when that is a settings class, each
    problem names its variable, all on one line. A ``SettingsError`` (a JSON value that does not
    parse) names only its field: the variable is the one of that field set in the environment.
    """
    if isinstance(error, ValidationError):
        groups = [group for group in _settings_classes() if group.__name__ == error.title]
        if not groups:
            return None
        return ConfigurationError(
            "; ".join(_setting_problem(groups[0], problem) for problem in error.errors())
        )
    if _is_settings_error(error):
        reason = str(error.__cause__ or error) or type(error.__cause__).__name__
        return ConfigurationError(f"{_unparsed_variable(error)} is malformed: {reason}")
    return None


def exit_code(error: BaseException) -> int:
    """The exit status for ``error``: a script can tell a refusal (retrying will not help)
    from an unavailable service (retrying later may) and from its own wrong invocation."""
    error = setting_error(error) or error
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, InfrastructureUnavailable | ReplyTimeout | ConnectionError | TimeoutError):
        return EXIT_UNAVAILABLE
    if _login_refused(error):
        return EXIT_USAGE
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
    error = setting_error(error) or error
    if isinstance(error, SchemaError):
        return list(error.problems)
    if isinstance(error, ValidationError):
        return [f"invalid input: {line}" for line in validation_lines(error)]
    line = (str(error).strip() or type(error).__name__).splitlines()[0]
    if _login_refused(error):  # a setting, though the driver's words name none
        return [
            f"the database refuses the login or database of a CONTEXTCORE_DATABASE_ URL: {line}"
        ]
    return [line]


def run_command(
    prog: str, body: Callable[[], int], *, expected: tuple[type[BaseException], ...] = ()
) -> int:
    """Run a command's body and turn every expected error into lines on stderr and a status.

    ``expected`` names further error types the command reports the same way (``OSError`` for a
    file it reads, the database driver's error for a command that runs SQL). A settings group
    that cannot be read is reported whatever ``expected`` says (:func:`setting_error`).
    """
    reported: tuple[type[BaseException], ...] = (ContextcoreError, ValidationError, *expected)
    try:
        return body()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as error:
        if not (isinstance(error, reported) or _is_settings_error(error) or _login_refused(error)):
            raise
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
