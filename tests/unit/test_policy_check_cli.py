"""``contextcore policy check``: admission of a policy file on its own (CLARIFICATIONS 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from consumers.cli import main


def write(tmp_path: Path, policy: object) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    return path


def test_an_admitted_policy_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {"total_token_budget": 0, "sources": []})
    assert main(["policy", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: admitted"


def test_a_source_unknown_to_the_process_is_refused_at_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        {"total_token_budget": 10, "sources": [{"name": "crystal_ball", "token_budget": 5}]},
    )
    assert main(["policy", "check", str(path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"{path}: sources[0].name: unknown source 'crystal_ball'"
    )


def test_a_malformed_policy_names_each_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, {"total_token_budget": "10", "sources": [], "page_order": ["x"]})
    assert main(["policy", "check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{path}: invalid input: total_token_budget: Input should be a valid integer"
    assert err[1].startswith(f"{path}: invalid input: page_order.0: Input should be ")
