"""Opening connections and pools with a bounded wait and a one-line error.

A server that does not answer, or will not take a connection now, is unavailable (exit 3: it
may pass later). A server that answers and refuses the login for good (a wrong password, a
login it does not know or ``pg_hba.conf`` refuses, a database it does not have) is a setting
to correct: a :class:`ConfigurationError` naming the variable the URL came from (exit 2), since
trying again with the same URL will never pass.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import asyncpg

from contextcore.storage.tenancy import become
from schemas.errors import ConfigurationError, InfrastructureUnavailable

_URL_SETTINGS = tuple(
    f"CONTEXTCORE_DATABASE_{name}" for name in ("URL", "READ_URL", "OWNER_URL", "ADMIN_URL")
)
"""The variables a URL comes from (``contextcore.storage.settings``: the pool takes URLs)."""

_LOGIN_REFUSED = frozenset({"28P01", "28000", "3D000"})
"""invalid_password; invalid_authorization_specification (no such login, or ``pg_hba.conf``
refuses it); invalid_catalog_name (no such database). None names the password."""


def redact(url: str) -> str:
    """The URL without its password, for error lines and logs: in the ``user:password@`` part
    or as a ``password=`` parameter (libpq and asyncpg take either)."""
    parts = urlsplit(url)
    if parts.password is not None:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name == "password" for name, _ in query):
        hidden = [(name, "***" if name == "password" else value) for name, value in query]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return parts.geturl()


def with_database(url: str, database: str) -> str:
    """``url`` naming another database on the same server, as the same login."""
    return urlsplit(url)._replace(path="/" + quote(database)).geturl()


def _not_connected(
    url: str, error: BaseException
) -> ConfigurationError | InfrastructureUnavailable:
    """Why no connection opened: the login refused (a setting), else the server unreachable."""
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    if getattr(error, "sqlstate", None) in _LOGIN_REFUSED:
        # the variables that hold this URL: more than one when they are set alike
        named = [variable for variable in _URL_SETTINGS if os.environ.get(variable) == url]
        if named:
            return ConfigurationError(
                f"{' or '.join(named)} is refused by the database at {redact(url)}: {reason}"
            )
        return ConfigurationError(f"the database at {redact(url)} refuses the login: {reason}")
    return InfrastructureUnavailable(f"cannot reach the database at {redact(url)}: {reason}")


async def connect(url: str, *, timeout_s: float = 5.0) -> asyncpg.Connection:
    """One connection.

    Raises:
        InfrastructureUnavailable: none opened within ``timeout_s``.
        ConfigurationError: the server refuses the login or has no such database.
    """
    try:
        return await asyncpg.connect(url, timeout=timeout_s)
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as error:
        raise _not_connected(url, error) from error


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to reset on release: every setting of a scope is transaction-local.

    asyncpg still rolls back a transaction left open before this runs; its default reset
    (``RESET ALL``, ``UNLISTEN *``, ``CLOSE ALL``, unlocks) costs a round trip per acquire and
    undoes nothing our scopes leave behind.
    """


async def create_pool(
    url: str,
    *,
    timeout_s: float = 5.0,
    min_size: int = 1,
    max_size: int = 10,
    session_role: str | None = None,
) -> asyncpg.Pool:
    """A pool whose first connections are open; :func:`connect`'s errors otherwise, and a
    :class:`ConfigurationError` when the login may not become ``session_role``.

    ``session_role``: each connection becomes that role once, for its whole session, so a
    statement needs no transaction around it to run as the role: the start journal's pool, and
    the consumers' pools, whose scoped reads (``TenantDatabase.read``) are one statement each.
    The role holds no tenant's scope: outside a scope, row security matches no tenant row, and
    ``RESET ROLE`` still drops to the login, which holds nothing.
    """

    async def init(conn: asyncpg.Connection) -> None:
        assert session_role is not None
        await become(conn, session_role, local=False)

    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            reset=_keep_session,
            init=init if session_role is not None else None,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as error:
        raise _not_connected(url, error) from error
    assert pool is not None
    return pool
