"""``dossier``: the organization's Company dossier, one item per fact.

Order, which is also spend order (the packer drops whole items, so a tight budget cuts the
documents first and keeps the company): the company, the services, one item per ideal customer
profile, one per offer, the user section, one per active document (newest first), then one item
with the total count of documents, which does not depend on how many document items are kept.

Options: ``include_user`` (default false; a subject with no user reads no user section) and
``include_documents`` (default true). ``spec.limit`` caps the document items only; a zero limit
returns no item and reads nothing. Items carry no ref and no subject key.

The organization part (company, services, profiles, offers) is cached for 60 s per organization
(:mod:`contextcore.sources.dossier_cache`), and a write to it invalidates every process's entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from contextcore.models import ContextItem, ContextRequest, ContextSourceSpec
from contextcore.sources.dossier_cache import DossierCache
from contextcore.storage.tenancy import TenantConnection, TenantDatabase, TenantQuery


class DossierOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_user: bool = False
    include_documents: bool = True


PROFILE = TenantQuery(
    "dossier.profile",
    """
-- dossier.profile: the Company profile the organization typed in Settings
SELECT company_name, website, description, industry, headquarters, value_proposition
FROM company_profiles
WHERE organization_id = $1
""",
)

SERVICES = TenantQuery(
    "dossier.services",
    """
-- dossier.services: in the order the organization set
SELECT name, description FROM dossier_services
WHERE organization_id = $1
ORDER BY position, name, id
""",
)

PROFILES = TenantQuery(
    "dossier.ideal_customer_profiles",
    """
-- dossier.ideal_customer_profiles: in the order the organization set
SELECT name, description, criteria FROM ideal_customer_profiles
WHERE organization_id = $1
ORDER BY position, name, id
""",
)

OFFERS = TenantQuery(
    "dossier.offers",
    """
-- dossier.offers: in the order the organization set
SELECT name, description, price FROM offers
WHERE organization_id = $1
ORDER BY position, name, id
""",
)

MEMBER = TenantQuery(
    "dossier.user",
    """
-- dossier.user: the person asking, as a member of this organization
SELECT full_name, title, role, about FROM organization_members
WHERE organization_id = $1 AND user_id = $2
""",
)

DOCUMENTS = TenantQuery(
    "dossier.documents",
    """
-- dossier.documents: active documents, newest first; $2 caps the rows (NULL: no cap). Each row
-- also carries the count of every active document, whatever the cap (a scalar subquery, run
-- once, answered from the partial index): one read for both.
SELECT title, summary, created_at,
       (SELECT count(*) FROM organization_documents
        WHERE organization_id = $1 AND status = 'active') AS total
FROM organization_documents
WHERE organization_id = $1 AND status = 'active'
ORDER BY created_at DESC, id DESC
LIMIT $2
""",
)


@dataclass(frozen=True)
class Fact:
    title: str
    body: str


def _joined(*parts: tuple[str, object]) -> str:
    return ". ".join(f"{label}: {value}" for label, value in parts if value)


async def _organization_part(tenant: TenantConnection) -> list[Fact]:
    facts: list[Fact] = []
    profile = await tenant.fetchrow(PROFILE)
    if profile is not None:
        facts.append(
            Fact(
                "Company",
                _joined(
                    ("Name", profile["company_name"]),
                    ("Website", profile["website"]),
                    ("Industry", profile["industry"]),
                    ("Headquarters", profile["headquarters"]),
                    ("Description", profile["description"]),
                    ("Value proposition", profile["value_proposition"]),
                ),
            )
        )
    services = await tenant.fetch(SERVICES)
    if services:
        facts.append(
            Fact(
                "Services",
                "; ".join(
                    f"{row['name']}: {row['description']}" if row["description"] else row["name"]
                    for row in services
                ),
            )
        )
    for row in await tenant.fetch(PROFILES):
        facts.append(
            Fact(
                f"Ideal customer profile: {row['name']}",
                _joined(("Description", row["description"]), ("Criteria", row["criteria"])),
            )
        )
    for row in await tenant.fetch(OFFERS):
        facts.append(
            Fact(
                f"Offer: {row['name']}",
                _joined(("Description", row["description"]), ("Price", row["price"])),
            )
        )
    return facts


class DossierContextSource:
    name = "dossier"
    options_schema: type[BaseModel] = DossierOptions

    def __init__(self, database: TenantDatabase, cache: DossierCache[list[Fact]]) -> None:
        self.database = database
        self.cache = cache

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        if spec.limit == 0:
            return []
        options = DossierOptions.model_validate(spec.options)
        organization_id: UUID = request.subject.organization_id
        items: list[ContextItem] = []
        async with self.database.scoped(organization_id) as tenant:
            facts = self.cache.get(organization_id)
            if facts is None:
                generation = self.cache.generation(organization_id)
                facts = await _organization_part(tenant)
                self.cache.put(organization_id, facts, generation=generation)
            items.extend(self._item(fact.title, fact.body) for fact in facts)
            user_id = request.subject.user_id
            if options.include_user and user_id is not None:
                member = await tenant.fetchrow(MEMBER, user_id)
                if member is not None:
                    items.append(
                        self._item(
                            "User",
                            _joined(
                                ("Name", member["full_name"]),
                                ("Title", member["title"]),
                                ("Role", member["role"]),
                                ("About", member["about"]),
                            ),
                        )
                    )
            if options.include_documents:
                documents = await tenant.fetch(DOCUMENTS, spec.limit)
                for row in documents:
                    items.append(
                        self._item(
                            f"Document: {row['title']}",
                            row["summary"] or "",
                        )
                    )
                count = documents[0]["total"] if documents else 0
                items.append(
                    self._item("Documents", f"The organization has {count} active document(s).")
                )
        return items

    def _item(self, title: str, body: str) -> ContextItem:
        return ContextItem(source=self.name, kind="dossier", title=title, body=body)
