"""The application source labels each value by its place in the read function's array: the
migration's arrays and ``PROJECTIONS`` must name the same columns in the same order."""

from __future__ import annotations

import re
from pathlib import Path

from contextcore.refs import PROJECTIONS

MIGRATION = (
    Path(__file__).resolve().parents[2]
    / "contextcore/storage/migrations/00029_build_reads_in_one_statement.sql"
)


def arrays_by_kind() -> dict[str, list[str]]:
    """Each branch of ``contextcore_read_application``: its kind and its array's columns, with
    casts and the timestamp renderer taken off."""
    body = MIGRATION.read_text().split("CREATE FUNCTION contextcore_read_application", 1)[1]
    body = body.split("$$;", 1)[0]
    found: dict[str, list[str]] = {}
    for kind, array in re.findall(r"SELECT '([a-z.]+)', \w+\.id,\s*ARRAY\[(.*?)\]", body, re.S):
        columns = []
        for expression in array.split(","):
            expression = re.sub(r"contextcore_isoformat\((.*)\)", r"\1", expression.strip())
            columns.append(expression.split("::")[0].split(".", 1)[1])
        found[kind] = columns
    return found


def test_every_kind_reads_its_projection_in_order() -> None:
    assert arrays_by_kind() == {kind: list(columns) for kind, columns in PROJECTIONS.items()}
