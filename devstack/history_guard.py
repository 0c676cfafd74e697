"""The migration-history guard: committed migration files are never modified, deleted or renamed.

Reads ``git log`` of the migrations folder from the first commit to ``HEAD`` and reports:

* a committed migration file that a later commit modified, deleted or renamed;
* a migration added with a version not greater than every version already committed;
* a committed migration that the working tree modified or deleted (uncommitted edits).

``.ci/run`` runs it on every build; it has no skip switch. Run it with
``python -m devstack.history_guard [REPO]``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

MIGRATIONS_PATH = "contextcore/storage/migrations"
_VERSION = re.compile(r"/(\d{5})_[^/]*\.sql$")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def check(repo: Path, migrations_path: str = MIGRATIONS_PATH) -> list[str]:
    """One line per violation; empty when the history is clean."""
    log = _git(
        repo,
        "log",
        "--reverse",
        "--no-renames",
        "--format=commit %h",
        "--name-status",
        "--",
        migrations_path,
    )
    problems: list[str] = []
    committed: dict[str, int] = {}
    commit = ""
    for line in log.splitlines():
        if line.startswith("commit "):
            commit = line.split()[1]
            continue
        if not line.strip():
            continue
        status, path = line.split("\t", 1)
        if not path.endswith(".sql"):
            continue
        match = _VERSION.search(path)
        if status == "A":
            if match is None:
                problems.append(f"{commit}: added {path}, not named NNNNN_short_name.sql")
                continue
            version = int(match.group(1))
            newest = max(committed.values(), default=0)
            if version <= newest:
                problems.append(
                    f"{commit}: added {path} with version {version:05d}, not above the newest "
                    f"committed version {newest:05d}"
                )
            committed[path] = version
        elif status == "M":
            problems.append(f"{commit}: modified the committed migration {path}")
        elif status == "D":
            problems.append(f"{commit}: deleted or renamed the committed migration {path}")
            committed.pop(path, None)
        else:
            problems.append(f"{commit}: changed the committed migration {path} ({status})")
    changed = _git(repo, "status", "--porcelain", "--no-renames", "--", migrations_path)
    for line in changed.splitlines():
        status, path = line[:2], line[3:]
        if path in committed and status.strip() in {"M", "D", "MM", "AM"}:
            problems.append(f"working tree: the committed migration {path} is changed ({status})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    repo = Path(args[0]) if args else Path.cwd()
    problems = check(repo)
    for problem in problems:
        print(f"migration history: {problem}", file=sys.stderr)
    if not problems:
        print("migration history: every committed migration is unchanged")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
