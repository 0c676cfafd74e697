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
from contextcore.storage.tenancy import TenantDatabase, TenantQuery

VISIBLE = TenantQuery(
    "definition_summary.visible",
    """
-- definition_summary.visible: published and listed, this organization's then the platform's
SELECT id, kind, name, safe_summary, created_at
FROM definitions
WHERE (organization_id = $1 OR organization_id IS NULL)
  AND status = 'published' AND visibility = 'listed'
ORDER BY organization_id IS NULL, kind, name, id
LIMIT $2
""",
)


class DefinitionSummaryContextSource:
    name = "definition_summary"
    options_schema: type[BaseModel] = NoOptions

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        async with self.database.scoped(request.subject.organization_id) as tenant:
            rows = await tenant.fetch(VISIBLE, spec.limit)
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
