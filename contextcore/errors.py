"""The one exception root of contextcore.

    ContextcoreError
    ├── ConfigurationError          a required setting is missing or malformed
    ├── InfrastructureUnavailable   a broker or database cannot be reached
    ├── SchemaError                 the database schema does not match the code's migrations
    │   └── MigrationFileError      the migration files themselves are malformed
    ├── PolicyError (ValueError)    a context policy fails admission (registry.py)
    └── RequiredContextSourceError  a required source failed; the run must fail (builder.py)

Every error carries a message that fits on one line: command-line entry points print
``str(error)`` and exit non-zero instead of showing a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def field_path(location: Sequence[int | str]) -> str:
    """A pydantic error location as a dotted path (``policy.sources.0.name``)."""
    return ".".join(str(part) for part in location)


def validation_lines(error: ValidationError) -> list[str]:
    """One ``path: message`` line per problem, for replies and command-line errors."""
    return [f"{field_path(e['loc']) or '<root>'}: {e['msg']}" for e in error.errors()]
