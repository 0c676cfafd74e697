"""``application``: the CRM and product rows the request already names, one item per field.

* It resolves ``request.entities`` only; it never searches ``request.query``.
* Refs are deduplicated by (kind, id), keeping the first occurrence (and its label); refs of an
  unsupported kind, or whose id cannot name a row, are dropped.
* One statement for every supported kind, whatever the number of refs (an array parameter per
  kind; CLARIFICATIONS 14), through the tenancy layer's scoped read; request order is
  restored afterwards. A ref that does not resolve for the subject (another tenant's, deleted,
  missing) yields nothing.
* The order is the request's (each ref's first occurrence), then projection order: it never
  depends on the statement's row order, which has no ORDER BY.
* Each non-null projected field becomes one item whose ``subject_key`` is
  ``<kind>:<id>:<column>``; the row id stays in ``ref``. ``spec.limit`` caps the items in ref
  order then projection order; 0 reads nothing, ``None`` applies no cap.
* ``intelligence.company`` / ``intelligence.person`` name global rows: they are read only as the
  embedded row of this tenant's bridge row (``prospects`` / ``prospect_people``), so a shared
  row no bridge of this tenant points at resolves to nothing. The database enforces it too: the
  service role reads the shared rows only through the ``tenant_intel_*`` views (00004).
* Values arrive as the text a brief shows (``contextcore_read_application``, 00029): numbers
  and ids as PostgreSQL writes them, timestamps as ``datetime.isoformat()`` does.
"""

from __future__ import annotations

from uuid import UUID

from asyncpg import Record
from pydantic import BaseModel

from contextcore.refs import PROJECTIONS, parse_uuid
from contextcore.sources.common import NoOptions
from contextcore.storage.application import KINDS, READ
from contextcore.storage.tenancy import TenantDatabase
from schemas.context import (
    ContextItem,
    ContextRequest,
    ContextSourceSpec,
    ResourceRef,
    make_subject_key,
)


class ApplicationContextSource:
    name = "application"
    options_schema: type[BaseModel] = NoOptions

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        # Dedupe by (kind, row id), the first occurrence (and its label) wins. An id that is not
        # a UUID can name no row; the resolved ref carries the row's canonical id.
        refs: dict[tuple[str, UUID], ResourceRef] = {}
        for ref in request.entities:
            row_id = parse_uuid(ref.id) if ref.kind in PROJECTIONS else None
            if row_id is not None:
                canonical = ResourceRef(kind=ref.kind, id=str(row_id), label=ref.label)
                refs.setdefault((ref.kind, row_id), canonical)
        if not refs:
            return []
        wanted: dict[str, list[UUID]] = {}
        for kind, row_id in refs:
            wanted.setdefault(kind, []).append(row_id)
        rows: dict[tuple[str, UUID], Record] = {}
        arrays = [wanted.get(kind, []) for kind in KINDS]
        for record in await self.database.read(READ, request.subject.organization_id, *arrays):
            rows[(record["kind"], record["id"])] = record
        items: list[ContextItem] = []
        for key, ref in refs.items():  # request order, then projection order
            if (row := rows.get(key)) is None:
                continue
            for column, value in zip(PROJECTIONS[ref.kind], row["fields"], strict=True):
                if value is None:
                    continue
                items.append(
                    ContextItem(
                        source=self.name,
                        kind="application",
                        title=column,
                        body=value,
                        subject_key=make_subject_key(ref, column),
                        ref=ref,
                        recorded_at=row["recorded_at"],
                    )
                )
                if spec.limit is not None and len(items) >= spec.limit:
                    return items
        return items
