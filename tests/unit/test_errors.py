"""Every exception class of the packages joins the one root and is drawn in its tree
(schemas/errors.py): read from the source, so no package has to be imported."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import schemas.errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contextcore", "schemas", "broker", "consumers", "producers", "admin", "devstack")


def _builtin_exception(name: str) -> bool:
    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, BaseException)


def exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Each exception class defined in the packages: its file and its bases' names."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                    classes[node.name] = (where, bases)
    exceptions: dict[str, tuple[str, list[str]]] = {}
    grew = True
    while grew:  # a class is an exception when a base is one
        grew = False
        for name, (where, bases) in classes.items():
            if name not in exceptions and any(
                _builtin_exception(b) or b in exceptions for b in bases
            ):
                exceptions[name] = (where, bases)
                grew = True
    return exceptions


def test_every_exception_class_derives_from_the_root_and_is_drawn() -> None:
    exceptions = exception_classes()
    assert {"ContextcoreError", "WireError", "PublishError", "ModelMoved"} <= set(exceptions)

    def rooted(name: str) -> bool:
        if name == "ContextcoreError":
            return True
        return any(b in exceptions and rooted(b) for b in exceptions[name][1])

    outside = sorted(
        f"{name} ({where})" for name, (where, _) in exceptions.items() if not rooted(name)
    )
    assert not outside, f"not under ContextcoreError: {outside}"
    tree = schemas.errors.__doc__ or ""
    undrawn = sorted(name for name in exceptions if name not in tree)
    assert not undrawn, f"missing from the tree in schemas/errors.py: {undrawn}"
