"""docs/settings.md is the settings classes as they are (issue 36, item 5): generated from them,
fresh, and covering every settings class of ours."""

from __future__ import annotations

import ast
from pathlib import Path

from devstack.settings_doc import DOC, GROUPS, ROOT, document

PACKAGES = ("contextcore", "consumers", "broker", "producers", "admin", "devstack")


def settings_classes_in_the_source() -> set[str]:
    """The classes of ours that subclass a settings class with an ``env_prefix`` of their own."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and "env_prefix=" in ast.unparse(node):
                    found.add(node.name)
    return found


def test_the_document_is_fresh() -> None:
    assert DOC.read_text() == document(), "stale: run python -m devstack.settings_doc"


def test_every_settings_class_is_in_it() -> None:
    assert settings_classes_in_the_source() == {cls.__name__ for cls in GROUPS}


def test_every_variable_of_every_class_is_a_row() -> None:
    text = DOC.read_text()
    for cls in GROUPS:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name in cls.model_fields:
            assert f"| `{prefix}{name.upper()}` |" in text


def test_the_readme_points_there() -> None:
    assert "docs/settings.md" in (Path(ROOT) / "README.md").read_text()
