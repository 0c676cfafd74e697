"""The dashboards' code: the checked-in JSON is what the code generates, and ``--check`` notices
a file that differs, is missing or is left over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitoring import dashboards


def test_the_checked_in_dashboards_are_what_the_code_generates() -> None:
    assert dashboards.main(["--check"]) == 0


def test_the_check_fails_on_an_edited_a_missing_or_a_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(dashboards, "OUT", tmp_path)
    assert dashboards.main([]) == 0
    assert dashboards.main(["--check"]) == 0
    overview = tmp_path / "contextcore-overview.json"
    edited = json.loads(overview.read_text())
    edited["title"] = "hand-edited"
    overview.write_text(json.dumps(edited))
    (tmp_path / "contextcore-memory.json").unlink()
    (tmp_path / "old.json").write_text("{}")
    assert dashboards.main(["--check"]) == 1
    err = capsys.readouterr().err
    for name in ("contextcore-overview.json", "contextcore-memory.json", "old.json"):
        assert name in err


def test_every_panel_has_a_query_and_every_query_reads_a_contextcore_series() -> None:
    found = dashboards.queries()
    titles = {(uid, title) for uid, title, _ in found}
    panels = [
        (board.uid, panel.title)
        for board in dashboards.BOARDS
        for row in board.rows.values()
        for panel in row
    ]
    assert len(panels) == len(set(panels)) == len(titles)
    assert all("contextcore_" in expr for _, _, expr in found)
    assert {board.uid for board in dashboards.BOARDS} == {
        "contextcore-overview",
        "contextcore-builds",
        "contextcore-ingestion",
        "contextcore-memory",
        "contextcore-kafka",
    }
