"""``application``: the CRM and product rows the request already names, one item per field.

* It resolves ``request.entities`` only; it never searches ``request.query``.
* Refs are deduplicated by (kind, id), keeping the first occurrence (and its label); refs of an
  unsupported kind, or whose id cannot name a row, are dropped.
* One query per supported kind, whatever the number of its refs (an array parameter;
  CLARIFICATIONS 14), through the tenancy layer; request order is
  restored afterwards. A ref that does not resolve for the subject (another tenant's, deleted,
  missing) yields nothing.
* Each non-null projected field becomes one item whose ``subject_key`` is
  ``<kind>:<id>:<column>``; the row id stays in ``ref``. ``spec.limit`` caps the items in ref
  order then projection order; 0 reads nothing, ``None`` applies no cap.
* ``intelligence.company`` / ``intelligence.person`` name global rows: they are read only as the
  embedded row of this tenant's bridge row (``prospects`` / ``prospect_people``), so a shared
  row no bridge of this tenant points at resolves to nothing. The database enforces it too: the
  service role reads the shared rows only through the ``tenant_intel_*`` views (00004).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from asyncpg import Record
from pydantic import BaseModel

from contextcore.models import (
    ContextItem,
    ContextRequest,
    ContextSourceSpec,
    ResourceRef,
    make_subject_key,
)
from contextcore.sources.common import NoOptions, as_text, parse_uuid
from contextcore.storage.tenancy import TenantDatabase, TenantQuery


@dataclass(frozen=True)
class Projection:
    kind: str
    columns: tuple[str, ...]
    query: TenantQuery  # $1 organization, $2 uuid[]; returns id, the columns, recorded_at


def _crm(
    kind: str,
    table: str,
    columns: tuple[str, ...],
    *,
    soft_delete: bool,
    recorded_at: str = "updated_at",
) -> Projection:
    deleted = " AND deleted_at IS NULL" if soft_delete else ""
    sql = (
        f"-- application.{kind}: the named rows of this tenant"
        f"{', soft-deleted rows excluded' if soft_delete else ''}\n"
        f"SELECT id, {', '.join(columns)}, {recorded_at} AS recorded_at\n"
        f"FROM {table}\n"
        f"WHERE organization_id = $1 AND id = ANY($2::uuid[]){deleted}"
    )
    return Projection(kind, columns, TenantQuery(f"application.{kind}", sql))


_INTEL_COMPANY_COLUMNS = (
    "name",
    "domain",
    "website",
    "description",
    "industry",
    "country",
    "linkedin_url",
    "employee_count_band",
)
_INTEL_PERSON_COLUMNS = (
    "full_name",
    "current_title",
    "current_company_text",
    "email",
    "linkedin_url",
    "country",
)

PROJECTIONS: dict[str, Projection] = {
    p.kind: p
    for p in (
        _crm(
            "crm.company",
            "crm_companies",
            (
                "name",
                "domain",
                "website",
                "industry",
                "lifecycle_stage",
                "employee_count",
                "country",
                "description",
                "linkedin_url",
                "owner_id",
            ),
            soft_delete=True,
        ),
        _crm(
            "crm.person",
            "crm_people",
            (
                "full_name",
                "email",
                "phone",
                "current_title",
                "company_id",
                "lifecycle_stage",
                "linkedin_url",
                "country",
                "owner_id",
            ),
            soft_delete=True,
        ),
        _crm(
            "crm.deal",
            "crm_deals",
            (
                "name",
                "stage",
                "status",
                "amount",
                "currency",
                "close_date",
                "owner_id",
                "company_id",
                "person_id",
            ),
            soft_delete=True,
        ),
        _crm(
            "crm.activity",
            "crm_activities",
            (
                "type",
                "subject",
                "status",
                "occurred_at",
                "due_at",
                "owner_id",
                "company_id",
                "person_id",
                "deal_id",
            ),
            soft_delete=False,
            recorded_at="created_at",
        ),
        _crm("crm.list", "crm_lists", ("name", "description", "kind"), soft_delete=True),
        _crm(
            "prospect",
            "prospects",
            (
                "review_state",
                "opportunity_score",
                "opportunity_reason",
                "recommended_action",
                "people_state",
                "people_state_reason",
            ),
            soft_delete=False,
            recorded_at="created_at",
        ),
        Projection(
            "intelligence.company",
            _INTEL_COMPANY_COLUMNS,
            TenantQuery(
                "application.intelligence.company",
                # The shared row is reached only through this tenant's prospects (the bridge).
                # lifecycle_stage is a tenant judgement and is not part of this projection.
                "-- application.intelligence.company: shared companies a prospect of this tenant"
                " points at\n"
                "SELECT DISTINCT ON (c.id) c.id, "
                + ", ".join(f"c.{column}" for column in _INTEL_COMPANY_COLUMNS)
                + ", NULL::timestamptz AS recorded_at\n"
                "FROM prospects AS p\n"
                "JOIN tenant_intel_companies AS c ON c.id = p.intel_company_id\n"
                "WHERE p.organization_id = $1 AND c.id = ANY($2::uuid[])\n"
                "ORDER BY c.id",
            ),
        ),
        Projection(
            "intelligence.person",
            _INTEL_PERSON_COLUMNS,
            TenantQuery(
                "application.intelligence.person",
                # One person watched at two companies has two bridge rows: keyed on the person.
                "-- application.intelligence.person: shared people a prospect_people row of this"
                " tenant points at\n"
                "SELECT DISTINCT ON (person.id) person.id, "
                + ", ".join(f"person.{column}" for column in _INTEL_PERSON_COLUMNS)
                + ", NULL::timestamptz AS recorded_at\n"
                "FROM prospect_people AS pp JOIN tenant_intel_people AS person"
                " ON person.id = pp.intel_person_id\n"
                "WHERE pp.organization_id = $1 AND person.id = ANY($2::uuid[])\n"
                "ORDER BY person.id",
            ),
        ),
    )
}


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
        async with self.database.scoped(request.subject.organization_id) as tenant:
            for kind, ids in wanted.items():  # one query per kind, every id in one array
                for record in await tenant.fetch(PROJECTIONS[kind].query, ids):
                    rows[(kind, record["id"])] = record
        items: list[ContextItem] = []
        for key, ref in refs.items():  # request order, then projection order
            if (row := rows.get(key)) is None:
                continue
            for column in PROJECTIONS[ref.kind].columns:
                value = row[column]
                if value is None:
                    continue
                items.append(
                    ContextItem(
                        source=self.name,
                        kind="application",
                        title=column,
                        body=as_text(value),
                        subject_key=make_subject_key(ref, column),
                        ref=ref,
                        recorded_at=row["recorded_at"],
                    )
                )
                if spec.limit is not None and len(items) >= spec.limit:
                    return items
        return items
