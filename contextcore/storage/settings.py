"""Database settings from the environment (``CONTEXTCORE_DATABASE_*``).

Nothing here falls back silently: a command that needs a URL asks for it through
:meth:`DatabaseSettings.require_url` / :meth:`DatabaseSettings.require_owner_url`, which raise a
one-line :class:`~schemas.errors.ConfigurationError` when the setting is absent.

Two credentials, never one (``docs/tenancy.md``): services log in with ``url``, a role that owns
nothing; only the schema commands use ``owner_url``. Kafka settings live in ``broker``, and each
consumer has settings of its own.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.envelope import printable
from schemas.errors import ConfigurationError

_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A role name PostgreSQL takes unquoted (fullmatch), the tenancy layer's rule."""


class DatabaseSettings(BaseSettings):
    """PostgreSQL + pgvector: where to connect, and as whom."""

    model_config = SettingsConfigDict(
        env_prefix="CONTEXTCORE_DATABASE_", extra="ignore", frozen=True, hide_input_in_errors=True
    )
    """``hide_input_in_errors``: a URL holds a password, which no error may print."""

    url: str | None = None
    """The runtime login: owns nothing, may only become the service role. Every runtime and
    admin command needs it."""
    read_url: str | None = None
    """Optional read replica; the build consumer reads sources through it when set."""
    owner_url: str | None = None
    """The schema owner: ``contextcore schema`` applies and checks migrations with it. A service
    never holds it."""
    admin_url: str | None = None
    """An administrator of the cluster: ``contextcore schema provision`` alone uses it."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    role: str = "contextcore_app"
    """The service role every tenant scope becomes (``SET LOCAL ROLE``): it owns no table, so
    row-level security applies. The runtime login must be a member of it."""
    pool_size: int = Field(default=20, ge=1)
    """Connections per process; every source read holds one for its scope."""

    @field_validator("url", "read_url", "owner_url", "admin_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        """A ``postgresql://`` (or ``postgres://``) URL whose ports are numbers: asyncpg refuses
        anything else only when it connects, and that reads as an unreachable database (exit 3)
        instead of a malformed setting. Empty is not set (``require_url``). The message never
        holds the URL: it may hold a password."""
        if not value:
            return value
        scheme, separator, _ = value.partition("://")
        if scheme not in ("postgresql", "postgres") or not separator:
            raise ValueError("not a postgresql:// URL")
        hosts = urlsplit(value).netloc.rpartition("@")[2]
        for host in hosts.split(","):  # asyncpg's several hosts: h1:5432,h2:5433
            port = host.rpartition("]")[2].partition(":")[2]  # "[::1]:5432" or "h:5432"
            if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError("a port is not a number from 1 to 65535")
        return value

    @field_validator("role")
    @classmethod
    def _plain_role(cls, role: str) -> str:
        """The tenancy layer names the role in the statement that enters a scope, so it takes a
        plain name only (``contextcore.storage.tenancy``): refused here, not when the first
        scope opens. Whether the database has that role, and lets the login become it, only
        the database can tell: the first statement that becomes it says which
        (``CONTEXTCORE_DATABASE_ROLE``, exit 2)."""
        if not _ROLE_NAME.fullmatch(role):
            raise ValueError(
                f"{printable(role)[:100]!r} is not a plain role name: 1 to 63 of a-z 0-9 _, "
                "not starting with a digit"
            )
        return role

    def require_url(self) -> str:
        if not self.url:
            raise ConfigurationError(
                "CONTEXTCORE_DATABASE_URL is not set: point it at a PostgreSQL + pgvector "
                "database as the runtime login (or run `contextcore dev up` and use the URL it "
                "prints)"
            )
        return self.url

    def require_owner_url(self) -> str:
        if not self.owner_url:
            raise ConfigurationError(
                "CONTEXTCORE_DATABASE_OWNER_URL is not set: schema commands run as the schema "
                "owner (`contextcore dev env` prints the dev stack's)"
            )
        return self.owner_url

    def require_admin_url(self) -> str:
        if not self.admin_url:
            raise ConfigurationError(
                "CONTEXTCORE_DATABASE_ADMIN_URL is not set: provisioning runs as an "
                "administrator of the PostgreSQL cluster"
            )
        return self.admin_url


def environ(*settings: BaseSettings) -> dict[str, str]:
    """Settings objects as the environment variables that configure a child process."""
    variables: dict[str, str] = {}
    for group in settings:
        prefix = str(group.model_config.get("env_prefix", ""))
        for name, value in group.model_dump(mode="json").items():
            if value is not None:
                text = json.dumps(value) if isinstance(value, list | dict) else str(value)
                variables[f"{prefix}{name}".upper()] = text
    return variables
