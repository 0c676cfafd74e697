"""``dossier``: the organization's Company dossier, one item per fact.

Order, which is also spend order (the packer drops whole items, so a tight budget cuts the
documents first and keeps the company): the company, the services, one item per ideal customer
profile, one per offer, the user section, one per active document (newest first), then one item
with the total count of documents, which does not depend on how many document items are kept.
The order is total (migration 00029): services, profiles and offers by ``(position, name, id)``,
documents by ``(created_at DESC, id DESC)``; every other part is one row.

Options: ``include_user`` (default false; a subject with no user reads no user section) and
``include_documents`` (default true). ``spec.limit`` caps the document items only; a zero limit
returns no item and reads nothing. Items carry no ref and no subject key.

What a read returned is cached for 60 s per organization and per asking user, options and limit
(:mod:`contextcore.cache`): a cached dossier costs no round trip. A write to any of its
tables (the organization part, documents, members; migrations 00003 and 00031) drops the
organization's entries in every process (``CHANNEL``).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from asyncpg import Record
from pydantic import BaseModel, ConfigDict

from contextcore.cache import TenantCache
from contextcore.storage.tenancy import ScopedRead, TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec


class DossierOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_user: bool = False
    include_documents: bool = True


CHANNEL = "contextcore_dossier"
"""Where a write to the organization part is told (migration 00003's triggers)."""

READ = ScopedRead(
    "dossier.read",
    "-- dossier.read: the organization part when $2 (always, since 00031), the member $3, the\n"
    "-- active documents newest first when $4 (at most $5; NULL: no cap) and their count, in\n"
    "-- that order; every field as text (00029)\n"
    "SELECT part, fields FROM contextcore_read_dossier($1, $2, $3, $4, $5)",
)


@dataclass(frozen=True)
class Fact:
    title: str
    body: str


def _joined(*parts: tuple[str, object]) -> str:
    return ". ".join(f"{label}: {value}" for label, value in parts if value)


def _facts(rows: list[Record]) -> list[Fact]:
    """The dossier in spend order from the read's rows (ordered by part): the company, the
    services as one fact, one fact per profile and per offer, the user, one per document, and
    the count of documents."""
    facts: list[Fact] = []
    services: list[str] = []
    for row in rows:
        part, fields = row["part"], row["fields"]
        if services and part != "service":  # the services end: one fact for them all
            facts.append(Fact("Services", "; ".join(services)))
            services = []
        if part == "profile":
            labels = ("Name", "Website", "Industry", "Headquarters", "Description")
            pairs = zip((*labels, "Value proposition"), fields, strict=True)
            facts.append(Fact("Company", _joined(*pairs)))
        elif part == "service":
            name, description = fields
            services.append(f"{name}: {description}" if description else name)
        elif part == "profile_of_customer":
            name, description, criteria = fields
            body = _joined(("Description", description), ("Criteria", criteria))
            facts.append(Fact(f"Ideal customer profile: {name}", body))
        elif part == "offer":
            name, description, price = fields
            body = _joined(("Description", description), ("Price", price))
            facts.append(Fact(f"Offer: {name}", body))
        elif part == "user":
            member = ("Name", "Title", "Role", "About")
            facts.append(Fact("User", _joined(*zip(member, fields, strict=True))))
        elif part == "document":
            title, summary = fields
            facts.append(Fact(f"Document: {title}", summary or ""))
        elif part == "documents":
            count = fields[0]
            facts.append(
                Fact("Documents", f"The organization's settings list {count} active document(s).")
            )
    if services:
        facts.append(Fact("Services", "; ".join(services)))
    return facts


class DossierContextSource:
    name = "dossier"
    options_schema: type[BaseModel] = DossierOptions

    def __init__(self, database: TenantDatabase, cache: TenantCache[list[Fact]]) -> None:
        self.database = database
        self.cache = cache

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        options = DossierOptions.model_validate(spec.options)
        organization_id: UUID = request.subject.organization_id
        user_id = request.subject.user_id if options.include_user else None
        key = (user_id, options.include_documents, spec.limit)
        facts = self.cache.get(organization_id, key)
        if facts is None:
            generation = self.cache.generation(organization_id)
            rows = await self.database.read(
                READ, organization_id, True, user_id, options.include_documents, spec.limit
            )
            facts = _facts(rows)
            self.cache.put(organization_id, facts, generation=generation, key=key)
        return [self._item(fact.title, fact.body) for fact in facts]

    def _item(self, title: str, body: str) -> ContextItem:
        return ContextItem(source=self.name, kind="dossier", title=title, body=body)
