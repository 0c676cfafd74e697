"""The words for row kinds: what a tool stored, and what a capability input accepts.

Run results store refs in the word the tool used (``crm_company``); a request names entities in
the capability word (``crm.company``). :func:`capability_ref_kind` owns the map and states which
kinds it joins: a stored kind it does not know joins nothing and is never rendered. An id that
is not a UUID names no row (:func:`parse_uuid`).
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
