"""A brief's manifest as a table a person reads in a terminal (``contextcore build --explain``).

Kept items first, then the dropped ones grouped by reason, each group in pack order, then the
sources that failed. Plain text: no colour, no markup; a long cell loses its middle to ``…``
(a subject key keeps its attribute, a ref the end of its id).
"""

from __future__ import annotations

from collections.abc import Sequence

from schemas.context import BriefManifest, ContextBrief, ManifestEntry

_CELL = 48


def _cut(text: str | None, width: int = _CELL) -> str:
    if not text:
        return "-"
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _reason_group(entry: ManifestEntry) -> str:
    return entry.outcome.split(":", 1)[0]


def explain(brief: ContextBrief, manifest: BriefManifest) -> str:
    """The brief's text, then the manifest's items and failed sources as tables."""
    kept = [e for e in manifest.items if e.outcome == "kept"]
    dropped = sorted(
        (e for e in manifest.items if e.outcome != "kept"), key=_reason_group
    )  # stable: pack order within a reason
    lines = [
        f"brief: {brief.tokens} tokens, sha256 {manifest.brief_sha256}",
        f"policy: sha256 {manifest.policy_sha256}",
        "",
        brief.text or "(empty)",
        "",
        f"items: {len(kept)} kept, {len(dropped)} dropped",
    ]
    if manifest.items:
        rows = [
            [_cut(e.outcome, 64), e.source, e.kind, str(e.tokens), _cut(e.ref), _cut(e.subject_key)]
            for e in (*kept, *dropped)
        ]
        lines += _table(["outcome", "source", "class", "tokens", "ref", "subject key"], rows)
    if manifest.failed_sources:
        lines += ["", f"failed sources: {len(manifest.failed_sources)}"]
        rows = []
        for failed in manifest.failed_sources:
            if failed.cause == "timeout":
                detail = f"after {failed.timeout_ms} ms"
            elif failed.cause == "error":
                detail = failed.error or "-"
            elif failed.cause == "missing":
                detail = "not registered in the consumer"
            else:
                detail = "returned an item of another source"
            rows.append([failed.source, "yes" if failed.required else "no", failed.cause, detail])
        lines += _table(["source", "required", "cause", "detail"], rows)
    return "\n".join(lines)
