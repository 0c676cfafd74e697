"""The migration runner: ordered, checksummed, immutable SQL files.

Invariants (``shared/STORAGE.md``):

* Files are ``NNNNN_short_name.sql`` with five-digit, unique, strictly increasing versions.
* Each file runs once, in its own transaction, unless its first line is
  ``-- contextcore: no-transaction`` (for statements such as ``CREATE INDEX CONCURRENTLY``).
* The database records each applied version with the sha256 of the file's bytes; ``verify``
  compares them and never writes.
* ``apply_pending`` holds a transaction-independent advisory lock, so two processes starting at
  once apply each file exactly once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from contextcore.storage.tenancy import service_role
from schemas.errors import MigrationFailed, MigrationFileError, SchemaError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE_NAME = re.compile(r"^(?P<version>\d{5})_(?P<name>[a-z0-9_]+)\.sql$")
_NO_TRANSACTION = "-- contextcore: no-transaction"
_LOCK_KEY = 0x636F6E74  # "cont": one advisory lock for every migrating process


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    checksum: str

    @property
    def label(self) -> str:
        return f"{self.version:05d}_{self.name}"

    @property
    def transactional(self) -> bool:
        return not self.sql.startswith(_NO_TRANSACTION)


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files of ``directory`` in version order.

    Raises:
        MigrationFileError: a ``.sql`` file is misnamed, or two files share a version.
    """
    found: dict[int, Migration] = {}
    problems: list[str] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            problems.append(f"migration file {path.name} is not named NNNNN_short_name.sql")
            continue
        raw = path.read_bytes()
        migration = Migration(
            version=int(match["version"]),
            name=match["name"],
            sql=raw.decode("utf-8"),
            checksum=hashlib.sha256(raw).hexdigest(),
        )
        if migration.version in found:
            problems.append(
                f"migrations {found[migration.version].label} and {migration.label} share a version"
            )
            continue
        found[migration.version] = migration
    if problems:
        raise MigrationFileError(problems)
    return [found[version] for version in sorted(found)]


# Applied versions and checksums; the ledger table does not exist before 00001 has run.
_APPLIED_SQL = """
SELECT version, name, checksum
FROM contextcore_migrations
ORDER BY version
"""

_RECORD_SQL = """
INSERT INTO contextcore_migrations (version, name, checksum) VALUES ($1, $2, $3)
"""


async def applied_migrations(conn: asyncpg.Connection) -> dict[int, tuple[str, str]]:
    """``{version: (name, checksum)}`` as the database records them; empty before 00001."""
    exists = await conn.fetchval("SELECT to_regclass('contextcore_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch(_APPLIED_SQL)
    return {row["version"]: (row["name"], row["checksum"]) for row in rows}


def problems_of(migrations: list[Migration], applied: dict[int, tuple[str, str]]) -> list[str]:
    """One line per mismatch between the files and the ledger; empty when they agree."""
    known = {migration.version: migration for migration in migrations}
    problems: list[str] = []
    for version, (name, checksum) in sorted(applied.items()):
        migration = known.get(version)
        if migration is None:
            problems.append(
                f"migration {version:05d}_{name} is applied but unknown to this code "
                "(the database is newer than the code)"
            )
        elif migration.checksum != checksum:
            problems.append(
                f"migration {migration.label} was modified after it was applied "
                f"(recorded sha256 {checksum[:12]}…, file {migration.checksum[:12]}…)"
            )
    for migration in migrations:
        if migration.version not in applied:
            problems.append(f"migration {migration.label} is pending")
    return problems


async def verify(
    conn: asyncpg.Connection,
    migrations: list[Migration] | None = None,
    *,
    role: str | None = None,
) -> None:
    """Read-only check that the database holds exactly the code's migrations.

    A service passes ``role`` (the service role): its login holds no privilege of its own, so
    the check reads the ledger as that role, in a read-only transaction.

    Raises:
        SchemaError: with one problem per pending, unknown or tampered migration.
    """
    migrations = load_migrations() if migrations is None else migrations
    if role is None:
        applied = await applied_migrations(conn)
    else:
        async with service_role(conn, role=role, readonly=True):
            applied = await applied_migrations(conn)
    problems = problems_of(migrations, applied)
    if problems:
        raise SchemaError(problems)


async def apply_pending(
    conn: asyncpg.Connection, migrations: list[Migration] | None = None
) -> list[Migration]:
    """Apply every pending migration in order and return those applied.

    Refuses to run (``SchemaError``) when an applied migration is unknown or tampered: adding
    files on top of a history the code does not recognise would only hide the mismatch.
    """
    migrations = load_migrations() if migrations is None else migrations
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        applied = await applied_migrations(conn)
        blocking = [p for p in problems_of(migrations, applied) if not p.endswith("is pending")]
        if blocking:
            raise SchemaError(blocking)
        done: list[Migration] = []
        for migration in migrations:
            if migration.version in applied:
                continue
            try:
                await _apply(conn, migration)
            except asyncpg.PostgresError as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise MigrationFailed(
                    [f"migration {migration.label} failed and was not applied: {reason}"]
                ) from error
            done.append(migration)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def _apply(conn: asyncpg.Connection, migration: Migration) -> None:
    if migration.transactional:
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(_RECORD_SQL, migration.version, migration.name, migration.checksum)
    else:
        await conn.execute(migration.sql)
        await conn.execute(_RECORD_SQL, migration.version, migration.name, migration.checksum)
