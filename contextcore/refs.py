"""The words for row kinds: what a tool stored, and what a capability input accepts.

Run results store refs in the word the tool used (``crm_company``); a request names entities in
the capability word (``crm.company``). :func:`capability_ref_kind` owns the map and states which
kinds it joins: a stored kind it does not know joins nothing and is never rendered. An id that
is not a UUID names no row (:func:`parse_uuid`). :data:`PROJECTIONS` says which capability kinds
name an application row a brief can show, and its fields: what the application source reads and
what a memory's subject may name.
"""

from __future__ import annotations

from uuid import UUID

STORED_TO_CAPABILITY: dict[str, str] = {
    "crm_company": "crm.company",
    "company": "crm.company",
    "crm_person": "crm.person",
    "person": "crm.person",
    "contact": "crm.person",
    "crm_deal": "crm.deal",
    "deal": "crm.deal",
    "crm_activity": "crm.activity",
    "activity": "crm.activity",
    "crm_list": "crm.list",
    "list": "crm.list",
    "prospect": "prospect",
    "intel_company": "intelligence.company",
    "intel_person": "intelligence.person",
}


def capability_ref_kind(stored_kind: str) -> str | None:
    """The capability word for a stored kind, or ``None`` when the kind joins nothing."""
    return STORED_TO_CAPABILITY.get(stored_kind)


def stored_kinds(capability_kind: str) -> list[str]:
    """Every stored word that means ``capability_kind`` (to match stored refs to entities)."""
    return [stored for stored, word in STORED_TO_CAPABILITY.items() if word == capability_kind]


def parse_uuid(raw: str) -> UUID | None:
    """The UUID ``raw`` names, or ``None``: an id that is not a UUID can name no row."""
    try:
        return UUID(raw)
    except ValueError:
        return None


PROJECTIONS: dict[str, tuple[str, ...]] = {
    "crm.company": (
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
    "crm.person": (
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
    "crm.deal": (
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
    "crm.activity": (
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
    "crm.list": ("name", "description", "kind"),
    "prospect": (
        "review_state",
        "opportunity_score",
        "opportunity_reason",
        "recommended_action",
        "people_state",
        "people_state_reason",
    ),
    # Shared rows, reached only through this tenant's bridge rows. lifecycle_stage is a tenant
    # judgement and is not part of the shared company's projection.
    "intelligence.company": (
        "name",
        "domain",
        "website",
        "description",
        "industry",
        "country",
        "linkedin_url",
        "employee_count_band",
    ),
    "intelligence.person": (
        "full_name",
        "current_title",
        "current_company_text",
        "email",
        "linkedin_url",
        "country",
    ),
}
"""The fields of each kind, in the order ``contextcore_read_application`` returns them (its
array of text) and the items follow. CRM rows that are soft-deleted resolve to nothing."""
