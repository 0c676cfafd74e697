"""``contextcore build --explain``'s table (producers/explain.py): kept first, then the dropped
items by reason in pack order, then the failed sources with their cause."""

from __future__ import annotations

from producers.explain import explain
from schemas.context import BriefManifest, ContextBrief, FailedRead, ManifestEntry


def entry(ref: str, outcome: str, tokens: int = 0) -> ManifestEntry:
    return ManifestEntry(
        source="application",
        kind="application",
        ref=ref,
        subject_key=f"{ref}:name",
        tokens=tokens,
        outcome=outcome,
    )


def test_kept_items_come_first_then_each_reason_then_the_failed_sources() -> None:
    manifest = BriefManifest(
        items=[
            entry("crm.company:1", "kept", 12),
            entry("crm.company:2", "over_total_budget"),
            entry("crm.company:3", "lost_key_to:dossier:crm.company:3"),
            entry("crm.company:4", "kept", 7),
            entry("crm.company:5", "over_total_budget"),
        ],
        failed_sources=[
            FailedRead(source="run_history", required=False, cause="timeout", timeout_ms=1000),
            FailedRead(source="memory", required=False, cause="error", error="OSError"),
        ],
        policy_sha256="p" * 64,
        brief_sha256="b" * 64,
    )
    brief = ContextBrief(
        text="## Application state\n- x",
        items=[],
        tokens=25,
        per_source_tokens={"application": 19},
        dropped={"application": 3},
        failed_sources=["run_history", "memory"],
    )
    lines = explain(brief, manifest).splitlines()

    assert lines[0] == f"brief: 25 tokens, sha256 {'b' * 64}"
    assert "## Application state" in lines
    table = lines[lines.index("items: 2 kept, 3 dropped") + 1 :]
    assert table[0].split() == ["outcome", "source", "class", "tokens", "ref", "subject", "key"]
    refs = [line.split()[4] for line in table[1:6]]
    assert refs == [f"crm.company:{n}" for n in (1, 4, 3, 2, 5)]  # kept, lost_key_to, over_total
    assert table[1].split()[:4] == ["kept", "application", "application", "12"]
    failed = lines[lines.index("failed sources: 2") + 1 :]
    assert failed[1].split() == ["run_history", "no", "timeout", "after", "1000", "ms"]
    assert failed[2].split() == ["memory", "no", "error", "OSError"]
