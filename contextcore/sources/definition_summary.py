"""``definition_summary``: the published, listed Agents, Workflows and Skills the subject can see.

Organization definitions and platform definitions (a null organization is the explicit platform
flag), one item each, with the safe summary only: never instructions, tools or configuration.
Organization rows come first, then platform rows, each by kind and name. ``spec.limit`` caps the
read; 0 reads nothing.
"""

from __future__ import annotations

from pydantic import BaseModel

from contextcore.models import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef
from contextcore.sources.common import NoOptions
from contextcore.storage.tenancy import ScopedRead, TenantDatabase

VISIBLE = ScopedRead(
    "definition_summary.visible",
    "-- definition_summary.visible: published and listed, this organization's then the\n"
    "-- platform's, by kind and name; $2 caps the rows (00029)\n"
    "SELECT id, kind, name, safe_summary, created_at FROM contextcore_read_definitions($1, $2)",
)


class DefinitionSummaryContextSource:
    name = "definition_summary"
    options_schema: type[BaseModel] = NoOptions

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        rows = await self.database.read(VISIBLE, request.subject.organization_id, spec.limit)
        return [
            ContextItem(
                source=self.name,
                kind="definition_summary",
                title=f"{row['kind'].capitalize()} {row['name']}",
                body=row["safe_summary"],
                ref=ResourceRef(kind=row["kind"], id=str(row["id"])),
                recorded_at=row["created_at"],
            )
            for row in rows
        ]
