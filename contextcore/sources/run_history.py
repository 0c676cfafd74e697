"""``run_history``: earlier runs of this subject or about its entities (episodic memory).

One read of ``runs``: this organization; created within ``lookback_hours`` (1..720, default 24);
the same user or trigger, or a result ref matching an entity of the request by kind and id; not
the current run. Root and child runs alike, newest first (``created_at DESC, id DESC``), capped
by ``spec.limit`` (default 5; 0 reads nothing).

Each item: title ``Run <status>``; body: the status, the parent run, the result summary, the
result refs as ``<capability kind> <id>``, and the waiting or failure reason when the status is
one of those. ``ref`` is the run, ``recorded_at`` its creation, no subject key. The rows the body
names go to ``body_refs`` in the stored word, so a reply may cite them; an id too long to render
is shortened in the body and is then not citable (never in ``body_refs``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contextcore.refs import capability_ref_kind, stored_kinds
from contextcore.storage.tenancy import ScopedRead, TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef

DEFAULT_LIMIT = 5
MAX_ID_CHARS = 64
MAX_SUMMARY_CHARS = 500
MAX_REASON_CHARS = 300


class RunHistoryOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lookback_hours: int = Field(default=24, ge=1, le=720, strict=True)


RECENT_RUNS = ScopedRead(
    "run_history.recent",
    "-- run_history.recent: this tenant's runs of the same user or trigger, or about an entity\n"
    "-- of the request, within the lookback, newest first, not the current run (00029)\n"
    "SELECT id, parent_run_id, status, result_summary, result_refs, waiting_reason,\n"
    "       failure_reason, created_at\n"
    "FROM contextcore_read_runs($1, $2, $3, $4, $5, $6, $7)",
)


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters with an ellipsis; and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[: limit - 1] + "…", True


def _entity_patterns(request: ContextRequest) -> list[str]:
    """JSON containment patterns: one per stored word of each entity's kind."""
    patterns = []
    for entity in request.entities:
        for stored in stored_kinds(entity.kind):
            patterns.append(json.dumps([{"kind": stored, "id": entity.id}]))
    return patterns


def _render(row: Any) -> tuple[str, list[ResourceRef]]:
    status = row["status"]
    parts = [status.capitalize()]
    if row["parent_run_id"] is not None:
        parts.append(f"Parent run {row['parent_run_id']}")
    summary = row["result_summary"]
    if isinstance(summary, str) and summary.strip():
        parts.append("Result: " + _bounded(summary.strip(), MAX_SUMMARY_CHARS)[0])
    rendered: list[str] = []
    citable: list[ResourceRef] = []
    refs = json.loads(row["result_refs"]) if isinstance(row["result_refs"], str) else []
    for stored in refs if isinstance(refs, list) else []:
        if not isinstance(stored, dict):
            continue
        kind, ref_id = stored.get("kind"), stored.get("id")
        if not isinstance(kind, str) or not isinstance(ref_id, str) or not ref_id:
            continue
        word = capability_ref_kind(kind)
        if word is None:
            continue  # a kind the map does not join is never rendered
        shown, shortened = _bounded(ref_id, MAX_ID_CHARS)
        rendered.append(f"{word} {shown}")
        if not shortened:
            citable.append(ResourceRef(kind=kind, id=ref_id))
    if rendered:
        parts.append("Refs: " + ", ".join(rendered))
    if status == "waiting" and row["waiting_reason"]:
        parts.append("Waiting: " + _bounded(row["waiting_reason"], MAX_REASON_CHARS)[0])
    if status == "failed" and row["failure_reason"]:
        parts.append("Failed: " + _bounded(row["failure_reason"], MAX_REASON_CHARS)[0])
    return ". ".join(parts), citable


class RunHistoryContextSource:
    name = "run_history"
    options_schema: type[BaseModel] = RunHistoryOptions

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        options = RunHistoryOptions.model_validate(spec.options)
        subject = request.subject
        patterns = _entity_patterns(request)
        if subject.user_id is None and subject.trigger_id is None and not patterns:
            return []  # nothing can select a run: no read
        limit = DEFAULT_LIMIT if spec.limit is None else spec.limit
        rows = await self.database.read(
            RECENT_RUNS,
            subject.organization_id,
            options.lookback_hours,
            subject.user_id,
            subject.trigger_id,
            patterns,
            request.run_id,
            limit,
        )
        items = []
        for row in rows:
            body, body_refs = _render(row)
            items.append(
                ContextItem(
                    source=self.name,
                    kind="run_history",
                    title=f"Run {row['status']}",
                    body=body,
                    ref=ResourceRef(kind="run", id=str(row["id"])),
                    body_refs=body_refs,
                    recorded_at=row["created_at"],
                )
            )
        return items
