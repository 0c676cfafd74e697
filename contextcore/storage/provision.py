"""Provisioning: the roles and the database that migrations and services expect. Run once per
cluster by an administrator (``contextcore schema provision``), by the dev stack, and by the tests.

Three roles, two of them credentials (docs/tenancy.md):

* the **owner** (the user of ``CONTEXTCORE_DATABASE_OWNER_URL``): LOGIN, owns the database and
  every object the migrations create; no SUPERUSER, CREATEDB, CREATEROLE or BYPASSRLS;
* the **service role** ``contextcore_app``: NOLOGIN NOINHERIT; holds the grants, RLS names it;
* the **runtime login** (the user of ``CONTEXTCORE_DATABASE_URL``): LOGIN NOINHERIT, a member of
  the service role and of nothing else, owns nothing. Until a scope runs ``SET LOCAL ROLE`` it
  holds no privilege at all, so ``RESET ROLE`` leaves it with none.

The administrator (``CONTEXTCORE_DATABASE_ADMIN_URL``) also installs pgvector, which is not a
trusted extension, and takes the public schema and temporary tables away from PUBLIC.
Everything is idempotent; a password in a URL is (re)set on its role.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import asyncpg

from contextcore.storage.pool import connect, with_database
from contextcore.storage.tenancy import SERVICE_ROLE
from schemas.errors import ConfigurationError


@dataclass(frozen=True)
class Login:
    user: str
    password: str | None
    database: str

    @classmethod
    def of(cls, url: str) -> Login:
        parts = urlsplit(url)
        database = unquote(parts.path.lstrip("/"))
        if not parts.username or not database:
            raise ConfigurationError("a database URL must name its user and its database")
        password = unquote(parts.password) if parts.password is not None else None
        return cls(unquote(parts.username), password, database)


# Each statement is built by the server with format(): identifiers %I, passwords %L.
_ROLE_EXISTS = "SELECT 1 FROM pg_roles WHERE rolname = $1"
_CREATE_LOGIN = (
    "SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS "
    "NOREPLICATION ' || $2::text, $1::text)"
)
_ALTER_LOGIN = (
    "SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS "
    "NOREPLICATION ' || $2::text, $1::text)"
)
# The password travels as a SCRAM verifier computed here: the clear text never reaches the
# server, its logs or pg_stat_statements.
_PASSWORD = "SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)"
_CREATE_SERVICE_ROLE = "SELECT format('CREATE ROLE %I NOLOGIN NOINHERIT', $1::text)"
_GRANT_MEMBERSHIP = "SELECT format('GRANT %I TO %I', $1::text, $2::text)"
# The roles a login is a member of: the runtime login must hold the service role alone.
_MEMBERSHIPS = """
SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = $1)
ORDER BY 1
"""
_DATABASE_OWNER = """
SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1
"""
_CREATE_DATABASE = "SELECT format('CREATE DATABASE %I OWNER %I', $1::text, $2::text)"
_SECURE_DATABASE = "SELECT format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', $1::text)"
_SCHEMA_ACCESS = (
    "SELECT format('REVOKE ALL ON SCHEMA public FROM PUBLIC; "
    "GRANT USAGE ON SCHEMA public TO %I', $1::text)"
)


async def _run(conn: asyncpg.Connection, builder: str, *args: str) -> None:
    statement: str = await conn.fetchval(builder, *args)
    await conn.execute(statement)


async def _ensure_login(
    conn: asyncpg.Connection, login: Login, attributes: str, done: list[str]
) -> None:
    if await conn.fetchval(_ROLE_EXISTS, login.user):
        await _run(conn, _ALTER_LOGIN, login.user, attributes)
    else:
        await _run(conn, _CREATE_LOGIN, login.user, attributes)
        done.append(f"created login role {login.user}")
    if login.password is not None:
        await _run(conn, _PASSWORD, login.user, scram_verifier(login.password))


def scram_verifier(password: str, *, iterations: int = 4096, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802, RFC 7677).

    PostgreSQL accepts a verifier in ``ALTER ROLE … PASSWORD`` and stores it as it is. Only
    printable ASCII is accepted, where SASLprep (which clients apply) changes nothing.

    Raises:
        ConfigurationError: the password holds anything but printable ASCII.
    """
    if not password.isascii() or not password.isprintable():
        raise ConfigurationError("a provisioned password must be printable ASCII")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = base64.b64encode
    return (
        f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
    )


async def provision_roles(
    conn: asyncpg.Connection, *, owner: Login, runtime: Login, service_role: str = SERVICE_ROLE
) -> list[str]:
    """Create or update the three roles on ``conn`` (an administrator's connection).

    Raises:
        ConfigurationError: the two logins are one role, or the runtime login is a member of a
            role other than the service role.
    """
    if owner.user == runtime.user:
        raise ConfigurationError(
            "the runtime login and the owner are one role: services must log in with a "
            "credential that owns nothing"
        )
    done: list[str] = []
    await _ensure_login(conn, owner, "INHERIT", done)
    if not await conn.fetchval(_ROLE_EXISTS, service_role):
        await _run(conn, _CREATE_SERVICE_ROLE, service_role)
        done.append(f"created service role {service_role}")
    await _ensure_login(conn, runtime, "NOINHERIT", done)
    await _run(conn, _GRANT_MEMBERSHIP, service_role, runtime.user)
    memberships = [row[0] for row in await conn.fetch(_MEMBERSHIPS, runtime.user)]
    if memberships != [service_role]:
        raise ConfigurationError(
            f"the runtime login {runtime.user} is a member of {', '.join(memberships)}: it may "
            f"hold {service_role} alone"
        )
    return done


async def provision_database(
    admin_url: str, database: str, *, owner: str, service_role: str = SERVICE_ROLE
) -> list[str]:
    """Create ``database`` owned by ``owner`` unless it exists, install pgvector, and take the
    public schema and temporary tables away from PUBLIC (the service role keeps schema USAGE).

    Raises:
        ConfigurationError: the database exists and another role owns it.
    """
    done: list[str] = []
    conn = await connect(admin_url)
    try:
        current = await conn.fetchval(_DATABASE_OWNER, database)
        if current is None:
            await _run(conn, _CREATE_DATABASE, database, owner)
            done.append(f"created database {database} owned by {owner}")
        elif current != owner:
            raise ConfigurationError(
                f"database {database} is owned by {current}, not by the owner {owner}"
            )
        await _run(conn, _SECURE_DATABASE, database)
    finally:
        await conn.close()
    inside = await connect(with_database(admin_url, database))
    try:
        await inside.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await _run(inside, _SCHEMA_ACCESS, service_role)
    finally:
        await inside.close()
    return done


async def provision(admin_url: str, *, owner_url: str, runtime_url: str) -> list[str]:
    """Everything above for the two URLs; returns one line per thing created.

    Raises:
        ConfigurationError: the URLs name two databases, or one role for both.
    """
    owner, runtime = Login.of(owner_url), Login.of(runtime_url)
    if owner.database != runtime.database:
        raise ConfigurationError(
            f"the owner URL names database {owner.database} and the runtime URL "
            f"{runtime.database}: they must name one"
        )
    conn = await connect(admin_url)
    try:
        done = await provision_roles(conn, owner=owner, runtime=runtime)
    finally:
        await conn.close()
    return done + await provision_database(admin_url, owner.database, owner=owner.user)
