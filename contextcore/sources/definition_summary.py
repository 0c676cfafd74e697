"""``definition_summary``: the published, listed Agents, Workflows and Skills the subject can see.

Organization definitions and platform definitions (a null organization is the explicit platform
flag), one item each, with the safe summary only: never instructions, tools or configuration.
Organization rows come first, then platform rows, each by kind and name, then id: the order is
total (two definitions may share a kind and a name), so the cap keeps the same ones every time.
``spec.limit`` caps the read; 0 reads nothing.

Definitions change when someone publishes one, not per turn: what a read returned is cached per
organization and limit for 60 s (:mod:`contextcore.cache`), and every write to
``definitions`` invalidates it in every process (``CHANNEL``; migration 00030): that
organization's entries, or every entry when a platform definition changed.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel

from contextcore.cache import TenantCache
from contextcore.sources.common import NoOptions
from contextcore.storage.tenancy import ScopedRead, TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef

CHANNEL = "contextcore_definitions"
"""Where a write to ``definitions`` is told: the organization's id, or empty for a platform
definition (migration 00030)."""

Row = tuple[UUID, str, str, str, datetime]
"""id, kind, name, safe summary, created at: what the cache keeps of a read."""

VISIBLE = ScopedRead(
    "definition_summary.visible",
    "-- definition_summary.visible: published and listed, this organization's then the\n"
    "-- platform's, by kind and name; $2 caps the rows (00029)\n"
    "SELECT id, kind, name, safe_summary, created_at FROM contextcore_read_definitions($1, $2)",
)


class DefinitionSummaryContextSource:
    name = "definition_summary"
    options_schema: type[BaseModel] = NoOptions

    def __init__(self, database: TenantDatabase, cache: TenantCache[list[Row]]) -> None:
        self.database = database
        self.cache = cache

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        organization_id = request.subject.organization_id
        rows = self.cache.get(organization_id, spec.limit)
        if rows is None:
            generation = self.cache.generation(organization_id)
            records = await self.database.read(VISIBLE, organization_id, spec.limit)
            rows = [
                (r["id"], r["kind"], r["name"], r["safe_summary"], r["created_at"]) for r in records
            ]
            self.cache.put(organization_id, rows, generation=generation, key=spec.limit)
        return [
            ContextItem(
                source=self.name,
                kind="definition_summary",
                title=f"{kind.capitalize()} {name}",
                body=summary,
                ref=ResourceRef(kind=kind, id=str(row_id)),
                recorded_at=created_at,
            )
            for row_id, kind, name, summary, created_at in rows
        ]
