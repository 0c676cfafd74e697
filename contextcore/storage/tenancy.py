"""The tenancy layer: the one door through which every organization-scoped read and write goes.

``TenantDatabase.read(query, organization_id, ...)`` is one statement outside any transaction: a
``contextcore_read_*`` function (migration 00029) that enters the organization's scope for that
statement alone, then reads; it needs a pool whose sessions are the service role.

``TenantDatabase.scoped(organization_id)`` (read-only) and ``TenantDatabase.writing(scope)``
(read-write) each open one transaction that

1. becomes the service role (``SET LOCAL ROLE contextcore_app``, through ``set_config``), which
   owns no table, so row-level security applies to every statement;
2. names the scope for the transaction: ``contextcore.organization_id``, or
   ``contextcore.platform = 'on'`` for the platform's own rows (a null organization). These
   settings are the key of every RLS policy;
3. hands out a :class:`TenantConnection` whose queries receive the organization id (``None`` in
   the platform scope) as ``$1``. A :class:`TenantQuery` must use ``$1``; a query that forgot
   to filter by it still sees only this scope's rows, because of (1) and (2).

There is no way to open a scope without naming it: an organization is a required ``UUID``, and
the platform is the explicit :data:`PLATFORM` value, never a default.

A database that is gone (refused, reset, shutting down or starting up: ``_LOST``) surfaces as
:class:`~schemas.errors.InfrastructureUnavailable`, whatever statement was running, so a
caller can tell "try again when it is back" from a statement that failed.

The limit of the second line of defence (docs/tenancy.md): the scope settings are ordinary
settings. SQL that an attacker could inject into this transaction could change them; RLS
catches a forgotten filter, not injected SQL. No query here interpolates input.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

import asyncpg

from schemas.errors import ConfigurationError, InfrastructureUnavailable

_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
SERVICE_ROLE = "contextcore_app"

# Enter a scope: open the transaction, become the service role and name the organization or
# the platform, for this transaction only (is_local = true). One round trip: a simple query of
# two statements. Its only values are the role (checked against _ROLE_NAME), the text of a
# UUID and a fixed word: nothing a caller supplies as free text.
_ENTER_SCOPE = (
    "BEGIN{mode}; SELECT set_config('role', '{role}', true), "
    "set_config('contextcore.organization_id', '{organization}', true), "
    "set_config('contextcore.platform', '{platform}', true)"
)


class Platform:
    """The platform's own scope: rows whose organization is null (shared documents)."""

    def __repr__(self) -> str:
        return "PLATFORM"


PLATFORM: Final = Platform()

Scope = UUID | Platform


@dataclass(frozen=True)
class TenantQuery:
    """A named, commented SQL statement. ``$1`` is always the organization id.

    Raises:
        ValueError: the SQL does not use ``$1`` (it could not be filtering by the tenant).
    """

    name: str
    sql: str

    def __post_init__(self) -> None:
        if not re.search(r"\$1(?!\d)", self.sql):
            raise ValueError(f"tenant query {self.name!r} does not filter by $1 (the organization)")


_READ_FUNCTION = re.compile(r"\bFROM contextcore_read_[a-z_]+\(\$1(?!\d)")


@dataclass(frozen=True)
class ScopedRead:
    """A named read that enters its own scope: one statement calling a ``contextcore_read_*``
    function with the organization id as ``$1`` (migration 00029). The function names the
    scope for its own statement only, then reads; the SQL of the read lives in the migration.

    Raises:
        ValueError: the SQL does not call a scoped read function with ``$1`` first.
    """

    name: str
    sql: str

    def __post_init__(self) -> None:
        if not _READ_FUNCTION.search(self.sql):
            raise ValueError(
                f"scoped read {self.name!r} does not call a contextcore_read_* function with $1"
            )


Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy


class TenantConnection:
    """A connection bound to one scope for one transaction.

    The scope opens its transaction with a plain ``BEGIN`` (one round trip with the settings),
    so asyncpg's ``Connection.transaction()`` cannot nest in it: use ``SAVEPOINT`` statements.
    """

    def __init__(
        self, conn: Connection, organization_id: UUID | None, counter: TenantDatabase
    ) -> None:
        self._conn = conn
        self._counter = counter
        self.organization_id = organization_id
        """The scope's organization; ``None`` in the platform scope."""

    async def fetch(self, query: TenantQuery, *args: Any) -> list[asyncpg.Record]:
        self._counter.round_trips += 1
        return list(await self._conn.fetch(query.sql, self.organization_id, *args))

    async def fetchrow(self, query: TenantQuery, *args: Any) -> asyncpg.Record | None:
        self._counter.round_trips += 1
        return await self._conn.fetchrow(query.sql, self.organization_id, *args)

    async def fetchval(self, query: TenantQuery, *args: Any) -> Any:
        self._counter.round_trips += 1
        return await self._conn.fetchval(query.sql, self.organization_id, *args)

    async def execute(self, query: TenantQuery, *args: Any) -> str:
        self._counter.round_trips += 1
        return await self._conn.execute(query.sql, self.organization_id, *args)

    async def read(self, query: ScopedRead, *args: Any) -> list[asyncpg.Record]:
        """A scoped read inside this transaction: the function names this scope's organization
        again, until the transaction ends. Never in the platform scope, which it would leave."""
        if self.organization_id is None:
            raise TypeError("a scoped read names an organization, not the platform")
        self._counter.round_trips += 1
        return list(await self._conn.fetch(query.sql, self.organization_id, *args))


def not_a_member(role: str) -> ConfigurationError:
    """The one line a process started with the wrong credential prints (the owner's URL as
    ``CONTEXTCORE_DATABASE_URL``, say): PostgreSQL's own error names neither the setting nor
    the fix, and a consumer's start-up would otherwise end in a traceback. A role other than
    the default may be the setting at fault instead: the line then names it too."""
    also = (
        ""
        if role == SERVICE_ROLE
        else "; or CONTEXTCORE_DATABASE_ROLE names a role the runtime login is no member of "
        f"(the service role is {SERVICE_ROLE} unless the database was provisioned with another)"
    )
    return ConfigurationError(
        f"the database login may not become the service role {role!r} (permission denied to "
        f"set role): CONTEXTCORE_DATABASE_URL must name the runtime login, a member of {role}, "
        f"never the schema owner or an administrator{also}"
    )


def no_such_role(role: str) -> ConfigurationError:
    """The one line a process started with a role the database does not have prints: a typo in
    ``CONTEXTCORE_DATABASE_ROLE``, or a database the service role was never created in.
    PostgreSQL's own error (``role ... does not exist``, SQLSTATE 22023, which no retry
    changes) names neither."""
    return ConfigurationError(
        f"the database has no role {role!r} (CONTEXTCORE_DATABASE_ROLE): it must name the "
        f"service role the migrations create ({SERVICE_ROLE} unless the database was "
        "provisioned with another), in a database `contextcore schema init` has migrated"
    )


ROLE_REFUSED = (asyncpg.InsufficientPrivilegeError, asyncpg.InvalidParameterValueError)
"""How a statement that becomes a role fails for the settings: 42501, the login is no member
of it; 22023, ``role ... does not exist``."""


def role_refused(role: str, error: BaseException) -> ConfigurationError:
    """The setting at fault when becoming ``role`` failed with ``error``, one of
    :data:`ROLE_REFUSED`."""
    if isinstance(error, asyncpg.InvalidParameterValueError):
        return no_such_role(role)
    return not_a_member(role)


async def become(conn: Connection, role: str, *, local: bool) -> None:
    """Make ``conn`` ``role``: for its transaction (``local``), or for its whole session.

    Raises:
        ConfigurationError: the database has no such role, or the login may not become it:
            a setting, never a failure a retry mends (exit 2).
    """
    try:
        await conn.execute("SELECT set_config('role', $1, $2)", role, local)
    except ROLE_REFUSED as error:
        raise role_refused(role, error) from error


@asynccontextmanager
async def service_role(
    conn: Connection, *, role: str = SERVICE_ROLE, readonly: bool = False
) -> AsyncIterator[None]:
    """A transaction of ``conn`` as the service role, in no tenant's scope: for what the role
    does across tenants (the schema check, the ledger's prune), never for tenant rows.

    Raises:
        ConfigurationError: the login is not a member of ``role`` (a wrong credential), or the
            database has no such role.
    """
    async with conn.transaction(readonly=readonly):
        await become(conn, role, local=True)
        yield


class TenantDatabase:
    """Scoped access to a pool (the primary, or a read replica for ``scoped`` reads)."""

    def __init__(self, pool: asyncpg.Pool | None, *, role: str = SERVICE_ROLE) -> None:
        """``pool`` may be ``None`` where sources are only declared (``contextcore policy
        check``): opening a scope then fails with :class:`InfrastructureUnavailable`."""
        if not _ROLE_NAME.fullmatch(role):
            raise ValueError(f"not a plain role name: {role!r}")
        self.pool = pool
        self.role = role
        self.round_trips = 0
        """Statements and transaction ends sent so far: every one a round trip (the bench and
        ``/metrics`` divide it by the builds)."""

    @asynccontextmanager
    async def scoped(self, organization_id: UUID) -> AsyncIterator[TenantConnection]:
        """A read-only transaction in one organization's scope."""
        if not isinstance(organization_id, UUID):
            raise TypeError("a tenant scope needs the organization id as a UUID")
        async with self._transaction(organization_id, readonly=True) as tenant:
            yield tenant

    async def read(
        self, query: ScopedRead, organization_id: UUID, *args: Any
    ) -> list[asyncpg.Record]:
        """One statement, one round trip, outside any transaction: the read function enters
        ``organization_id``'s scope for that statement alone (migration 00029).

        The pool's connections must be the service role for their whole session
        (``create_pool(session_role=...)``): the login itself may not run the function.
        A read cancelled mid-statement (a source timeout) closes its connection.
        """
        if not isinstance(organization_id, UUID):
            raise TypeError("a tenant scope needs the organization id as a UUID")
        if self.pool is None:
            raise InfrastructureUnavailable("this process has no database pool")
        try:
            conn = await self.pool.acquire()
        except (OSError, TimeoutError, *_LOST) as error:
            raise _unavailable(error) from error
        try:
            self.round_trips += 1
            return list(await conn.fetch(query.sql, UUID(int=organization_id.int), *args))
        except _LOST as error:
            raise _unavailable(error) from error
        except (asyncpg.UndefinedFunctionError, asyncpg.InsufficientPrivilegeError) as error:
            # the login itself can neither see nor run the read functions
            raise ConfigurationError(
                f"scoped read {query.name} needs a pool whose sessions are the service role "
                f"{self.role!r} (create_pool(session_role=...)): {error}"
            ) from error
        except asyncpg.PostgresError:
            raise  # the statement failed; the connection is idle and clean
        except asyncpg.InterfaceError as error:
            lost = conn.is_closed()
            conn.terminate()
            if lost:  # the server went away mid-statement: try again when it is back
                raise _unavailable(error) from error
            raise
        except BaseException:
            conn.terminate()  # cancelled or broken mid-statement: never reused
            raise
        finally:
            await self.pool.release(conn)

    @asynccontextmanager
    async def writing(self, scope: Scope) -> AsyncIterator[TenantConnection]:
        """A read-write transaction in one organization's scope, or in the platform's.

        The effect of a message and its ledger claim (:mod:`contextcore.storage.ledger`) go
        into one such transaction, so they commit or roll back together.
        """
        if not isinstance(scope, UUID | Platform):
            raise TypeError("a write scope is an organization id (UUID) or PLATFORM")
        async with self._transaction(scope, readonly=False) as tenant:
            yield tenant

    @asynccontextmanager
    async def writing_each(self) -> AsyncIterator[Connection]:
        """A read-write transaction as the service role in no scope at all, for one SQL
        function that names the organization of each row itself before it touches the row
        (``memory_apply``: one transaction for many organizations' writes).

        Until such a function names one, row-level security matches no row: a statement run
        here that forgot to scope itself reads and writes nothing. Only functions whose
        migration documents that they scope every row belong in this transaction.
        """
        async with self._transaction(None, readonly=False) as tenant:
            yield tenant._conn

    @asynccontextmanager
    async def _transaction(
        self, scope: Scope | None, *, readonly: bool
    ) -> AsyncIterator[TenantConnection]:
        """``scope`` ``None``: no organization and not the platform (:meth:`writing_each`)."""
        if self.pool is None:
            raise InfrastructureUnavailable("this process has no database pool")
        organization = scope if isinstance(scope, UUID) else None
        enter = _ENTER_SCOPE.format(
            # a write reads what committed before each statement: memory_apply's lock-then-read
            # (migration 00027) relies on it, whatever the database's default isolation
            mode=" READ ONLY" if readonly else " ISOLATION LEVEL READ COMMITTED",
            role=self.role,
            # a plain UUID's text, whatever subclass the caller passed
            organization="" if organization is None else str(UUID(int=organization.int)),
            platform="on" if isinstance(scope, Platform) else "",
        )
        try:
            conn = await self.pool.acquire()
        except (OSError, TimeoutError, *_LOST) as error:
            raise _unavailable(error) from error
        try:
            try:
                try:
                    self.round_trips += 1
                    await conn.execute(enter)
                except ROLE_REFUSED as error:
                    raise role_refused(self.role, error) from error
                yield TenantConnection(conn, organization, self)
            except BaseException:
                await _abandon(conn)
                raise
            self.round_trips += 1
            await conn.execute("COMMIT")
        except _LOST as error:
            raise _unavailable(error) from error
        except asyncpg.InterfaceError as error:
            if not conn.is_closed():
                raise
            raise _unavailable(error) from error
        finally:
            await self.pool.release(conn)


_LOST = (
    asyncpg.PostgresConnectionError,  # class 08: the connection failed or is gone
    asyncpg.AdminShutdownError,  # 57P01: the server is shutting down
    asyncpg.CrashShutdownError,  # 57P02
    asyncpg.CannotConnectNowError,  # 57P03: the server is starting or stopping
    ConnectionError,  # refused, reset, broken pipe
)
"""The errors of a database that is gone (not of a statement): the caller waits and tries
again (the delivery runtime does it in place, without spending an attempt)."""


def _unavailable(error: BaseException) -> InfrastructureUnavailable:
    text = str(error).splitlines()[0] if str(error) else ""
    return InfrastructureUnavailable(
        f"the database did not answer: {type(error).__name__}{': ' if text else ''}{text[:200]}"
    )


async def _abandon(conn: Connection) -> None:
    """Roll back a scope that failed. A read cancelled mid-query (a source timeout) leaves the
    connection busy with the cancellation: it is closed instead, and the pool opens another."""
    if conn.is_closed() or not conn.is_in_transaction():
        return
    try:
        await conn.execute("ROLLBACK")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        conn.terminate()
