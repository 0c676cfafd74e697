"""A package's index is its folder (issue 36, item 5): where a package's docstring lists its
modules (``name.py   what it is``, one a line, a sub-folder as ``name/``), it lists each module
and sub-folder of the package, and nothing that is not there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contextcore", "consumers", "broker", "producers", "admin", "schemas", "devstack")
ENTRY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.py|/))\s{2,}\S")


def indexes() -> dict[Path, set[str]]:
    """``{package folder: the names its docstring lists}``, for the packages with an index."""
    found: dict[Path, set[str]] = {}
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            listed = {m.group(1) for line in doc.splitlines() if (m := ENTRY.match(line))}
            if listed:
                found[init.parent] = listed
    return found


def contents(folder: Path) -> set[str]:
    modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    folders = {
        f"{p.name}/"
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith((".", "__")) and p.name != "node_modules"
    }
    return modules | folders


def test_the_indexes_are_found() -> None:
    expected = {"admin", "devstack", "contextcore/knowledge", "contextcore/knowledge/adapters"}
    expected |= {"contextcore/memory", "contextcore/memory/adapters"}
    assert {ROOT / folder for folder in expected} <= set(indexes())


def test_every_index_lists_its_folder_exactly() -> None:
    for folder, listed in indexes().items():
        where = folder.relative_to(ROOT)
        there = contents(folder)
        assert listed == there, (
            f"{where}/__init__.py: listed but absent {sorted(listed - there)}, "
            f"present but not listed {sorted(there - listed)}"
        )
