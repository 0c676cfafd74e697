"""docs/settings.md: every environment variable of every settings class, generated from the
classes themselves, so the table cannot drift from the code.

    python -m devstack.settings_doc          write docs/settings.md
    python -m devstack.settings_doc --check  exit 1 when the committed file is stale

Each row is a field: its variable (the class's prefix and the field's name), its default (or
*required*) and the first sentence of the docstring under the field in the class's source (a
subclass's own docstring wins over its base's). tests/unit/test_settings_doc.py runs the check.
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from broker.settings import KafkaSettings, TopicSettings
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.sweep.app import SweepSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings
from devstack.generated import generator_main
from devstack.stack import DevSettings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "settings.md"
GROUPS: tuple[type[BaseSettings], ...] = (
    DatabaseSettings,
    KafkaSettings,
    TopicSettings,
    BuildSettings,
    UploadSettings,
    EmbedSettings,
    MemorySettings,
    SweepSettings,
    KnowledgeSettings,
    DevSettings,
)
"""Every settings class a process of ours reads (a new one is added here; the unit test
fails on a BaseSettings subclass of ours this tuple misses)."""


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of ``cls`` and its bases, from their source (the docstring is the
    string right under the field); a subclass's wins."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseSettings)):
            continue
        if klass.__module__.startswith("pydantic"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, [*body[1:], None], strict=True):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.target.id] = " ".join(after.value.value.split())
    return found


def first_sentence(text: str) -> str:
    """Up to the first full stop (the whole text without one), in Markdown's backticks."""
    if ". " in text:
        text = text[: text.index(". ") + 1]
    return text.replace("``", "`").replace("|", "\\|")


def default_of(info: Any) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "*required*"
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value) if isinstance(value, list | dict | bool) else value}`"


def table(cls: type[BaseSettings]) -> str:
    prefix = str(cls.model_config.get("env_prefix", ""))
    docs = field_docs(cls)
    module = inspect.getsourcefile(cls)
    where = Path(module).resolve().relative_to(ROOT) if module else cls.__module__
    lines = [
        f"## `{prefix}*`",
        "",
        f"`{cls.__name__}`, [{where}](../{where})",
        "",
        "| variable | default | what |",
        "|---|---|---|",
    ]
    for name, info in cls.model_fields.items():
        lines.append(
            f"| `{prefix}{name.upper()}` | {default_of(info)} | "
            f"{first_sentence(docs.get(name, ''))} |"
        )
    return "\n".join(lines)


def document() -> str:
    head = (
        "# Settings\n\n"
        "Every process reads its settings from environment variables, one prefix per group.\n"
        "This file is generated from the settings classes by `python -m devstack.settings_doc`\n"
        "(tests/unit/test_settings_doc.py fails when it is stale); each class's source says more\n"
        "about each field than the first sentence here. `CONTEXTCORE_DEV_*` is the dev stack's\n"
        "(dev and tests only).\n"
    )
    return head + "\n" + "\n\n".join(table(cls) for cls in GROUPS) + "\n"


main = generator_main("devstack.settings_doc", __doc__, DOC, document)


if __name__ == "__main__":
    raise SystemExit(main())
