"""Opening connections and pools with a bounded wait and a one-line error."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

import asyncpg

from contextcore.storage.tenancy import not_a_member
from schemas.errors import InfrastructureUnavailable


def redact(url: str) -> str:
    """The URL without its password, for error lines and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def with_database(url: str, database: str) -> str:
    """``url`` naming another database on the same server, as the same login."""
    return urlsplit(url)._replace(path="/" + quote(database)).geturl()


def _unreachable(url: str, error: BaseException) -> InfrastructureUnavailable:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return InfrastructureUnavailable(f"cannot reach the database at {redact(url)}: {reason}")


async def connect(url: str, *, timeout_s: float = 5.0) -> asyncpg.Connection:
    """One connection, or :class:`InfrastructureUnavailable` after ``timeout_s``."""
    try:
        return await asyncpg.connect(url, timeout=timeout_s)
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as error:
        raise _unreachable(url, error) from error


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
    """A pool whose first connections are open, or :class:`InfrastructureUnavailable`.

    ``session_role``: each connection becomes that role once, for its whole session, so a
    statement needs no transaction around it to run as the role: the start journal's pool, and
    the consumers' pools, whose scoped reads (``TenantDatabase.read``) are one statement each.
    The role holds no tenant's scope: outside a scope, row security matches no tenant row, and
    ``RESET ROLE`` still drops to the login, which holds nothing.
    """

    async def become(conn: asyncpg.Connection) -> None:
        try:
            await conn.execute("SELECT set_config('role', $1, false)", session_role)
        except asyncpg.InsufficientPrivilegeError as error:
            assert session_role is not None
            raise not_a_member(session_role) from error

    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            reset=_keep_session,
            init=become if session_role is not None else None,
        )
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as error:
        raise _unreachable(url, error) from error
    assert pool is not None
    return pool
