"""Migration files, the ledger comparison, and the git-history guard (pure, or on a temp repo)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from contextcore.storage.migrations import MIGRATIONS_DIR, load_migrations, problems_of
from devstack import history_guard
from schemas.errors import MigrationFileError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_migrations_are_well_formed_and_start_with_the_foundation() -> None:
    migrations = load_migrations()
    assert [m.label for m in migrations[:2]] == ["00001_foundation", "00002_processed_messages"]
    assert [m.version for m in migrations] == sorted({m.version for m in migrations})
    assert all(m.transactional for m in migrations)


def test_misnamed_and_duplicated_versions_are_refused(tmp_path: Path) -> None:
    (tmp_path / "00001_a.sql").write_text("SELECT 1;")
    (tmp_path / "00001_b.sql").write_text("SELECT 2;")
    (tmp_path / "2_bad.sql").write_text("SELECT 3;")
    with pytest.raises(MigrationFileError) as raised:
        load_migrations(tmp_path)
    assert raised.value.problems == [
        "migrations 00001_a and 00001_b share a version",
        "migration file 2_bad.sql is not named NNNNN_short_name.sql",
    ]


def test_problems_name_pending_unknown_and_tampered_migrations(tmp_path: Path) -> None:
    (tmp_path / "00001_a.sql").write_text("SELECT 1;")
    (tmp_path / "00002_b.sql").write_text("SELECT 2;")
    first, _ = load_migrations(tmp_path)
    applied = {1: ("a", "f" * 64), 7: ("gone", first.checksum)}
    assert problems_of(load_migrations(tmp_path), applied) == [
        f"migration 00001_a was modified after it was applied (recorded sha256 {'f' * 12}…, "
        f"file {first.checksum[:12]}…)",
        "migration 00007_gone is applied but unknown to this code (the database is newer than "
        "the code)",
        "migration 00002_b is pending",
    ]
    assert problems_of(load_migrations(tmp_path)[:1], {1: ("a", first.checksum)}) == []


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.invalid")
    git(tmp_path, "config", "user.name", "t")
    folder = tmp_path / history_guard.MIGRATIONS_PATH
    folder.mkdir(parents=True)
    (folder / "00001_a.sql").write_text("SELECT 1;")
    (folder / "00002_b.sql").write_text("SELECT 2;")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "two migrations")
    return tmp_path


def test_a_clean_history_passes(repo: Path) -> None:
    folder = repo / history_guard.MIGRATIONS_PATH
    (folder / "00003_c.sql").write_text("SELECT 3;")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a third")
    assert history_guard.check(repo) == []


def test_a_modified_committed_migration_fails_in_history_and_in_the_tree(repo: Path) -> None:
    path = repo / history_guard.MIGRATIONS_PATH / "00001_a.sql"
    path.write_text("SELECT 'edited';")
    [problem] = history_guard.check(repo)
    assert "working tree: the committed migration" in problem
    git(repo, "commit", "-qam", "edit")
    [problem] = history_guard.check(repo)
    assert problem.endswith(
        f"modified the committed migration {history_guard.MIGRATIONS_PATH}/00001_a.sql"
    )


def test_deleted_renamed_and_out_of_order_migrations_fail(repo: Path) -> None:
    folder = history_guard.MIGRATIONS_PATH
    git(repo, "mv", f"{folder}/00002_b.sql", f"{folder}/00004_b.sql")
    git(repo, "commit", "-qm", "rename")
    (repo / folder / "00003_late.sql").write_text("SELECT 3;")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "late")
    git(repo, "rm", "-q", f"{folder}/00001_a.sql")
    git(repo, "commit", "-qm", "delete")
    problems = history_guard.check(repo)
    assert [p.split(": ", 1)[1] for p in problems] == [
        f"deleted or renamed the committed migration {folder}/00002_b.sql",
        f"added {folder}/00003_late.sql with version 00003, not above the newest committed "
        "version 00004",
        f"deleted or renamed the committed migration {folder}/00001_a.sql",
    ]


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout (sdist)")
def test_this_repository_history_never_changed_a_committed_migration() -> None:
    assert history_guard.check(REPO) == []
    assert (REPO / history_guard.MIGRATIONS_PATH) == MIGRATIONS_DIR
