"""The demo organization: a handful of rows every source can read. Idempotent.

Seed data lives here, never in a migration. ``contextcore demo`` writes it as the table owner
(the way an admin or a sync job writes), then asks the build consumer for a brief about it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg

ORGANIZATION = UUID("00000000-0000-4000-8000-00000000c0de")
USER = UUID("00000000-0000-4000-8000-0000000000a1")
ACME = UUID("00000000-0000-4000-8000-0000000000c1")
ADA = UUID("00000000-0000-4000-8000-0000000000b1")
RENEWAL = UUID("00000000-0000-4000-8000-0000000000d1")
CONVERSATION = UUID("00000000-0000-4000-8000-0000000000e1")
EARLIER_RUN = UUID("00000000-0000-4000-8000-0000000000f1")
RESEARCHER = UUID("00000000-0000-4000-8000-0000000000a9")

# One statement per row, each a no-op when the row exists.
_ROWS: list[tuple[str, tuple[object, ...]]] = [
    (
        "INSERT INTO organizations (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        (ORGANIZATION, "Northwind Robotics"),
    ),
    (
        "INSERT INTO organization_members (organization_id, user_id, full_name, title, role)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        (ORGANIZATION, USER, "Dana Reyes", "Account Executive", "sales"),
    ),
    (
        "INSERT INTO company_profiles (organization_id, company_name, industry, value_proposition)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        (
            ORGANIZATION,
            "Northwind Robotics",
            "Warehouse automation",
            "Robots that cut picking errors in half",
        ),
    ),
    (
        "INSERT INTO offers (organization_id, id, name, description, price)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        (ORGANIZATION, UUID(int=1), "Pilot", "Two robots for 90 days", "12k USD"),
    ),
    (  # a document of the organization's settings (the dossier's); the handbook the demo
        # uploads is a knowledge source, which the knowledge source reads
        "INSERT INTO organization_documents (organization_id, id, title, summary)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        (
            ORGANIZATION,
            UUID(int=2),
            "Pricing guidelines 2027",
            "Pilots at list price; discounts above 10% need the sales director.",
        ),
    ),
    (
        "INSERT INTO crm_companies (organization_id, id, name, domain, industry, lifecycle_stage,"
        " employee_count) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        (ORGANIZATION, ACME, "Acme Logistics", "acme.example", "Logistics", "customer", 1200),
    ),
    (
        "INSERT INTO crm_people (organization_id, id, full_name, current_title, company_id, email)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        (ORGANIZATION, ADA, "Ada Park", "VP Operations", ACME, "ada@acme.example"),
    ),
    (
        "INSERT INTO crm_deals (organization_id, id, name, stage, amount, currency, company_id,"
        " person_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        (ORGANIZATION, RENEWAL, "Acme renewal 2027", "negotiation", 84000, "USD", ACME, ADA),
    ),
    (
        "INSERT INTO definitions (id, organization_id, kind, name, safe_summary, status)"
        " VALUES ($1, $2, 'agent', $3, $4, 'published') ON CONFLICT DO NOTHING",
        (
            RESEARCHER,
            ORGANIZATION,
            "Account researcher",
            "Reads CRM rows and public news to prepare a call brief.",
        ),
    ),
    (
        "INSERT INTO conversations (organization_id, id, user_id, summary)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        (ORGANIZATION, CONVERSATION, USER, "Dana is preparing the Acme renewal call."),
    ),
]


async def seed_demo(conn: asyncpg.Connection) -> None:
    """Write the demo rows (as the table owner); a second run changes nothing."""
    now = datetime.now(UTC)
    async with conn.transaction():
        for sql, args in _ROWS:
            await conn.execute(sql, *args)
        await conn.execute(
            "INSERT INTO conversation_messages (organization_id, id, conversation_id, role,"
            " content, created_at) VALUES ($1, $2, $3, 'user', $4, $5) ON CONFLICT DO NOTHING",
            ORGANIZATION,
            UUID(int=2),
            CONVERSATION,
            "What should I know before I call Ada at Acme tomorrow?",
            now,
        )
        # Run history looks back 24 h by default: keep the demo run recent.
        await conn.execute(
            "INSERT INTO runs (organization_id, id, user_id, status, result_summary, result_refs,"
            " created_at) VALUES ($1, $2, $3, 'completed', $4, $5, $6)"
            " ON CONFLICT (organization_id, id) DO UPDATE SET created_at = EXCLUDED.created_at",
            ORGANIZATION,
            EARLIER_RUN,
            USER,
            "Drafted the renewal proposal",
            json.dumps([{"kind": "crm_deal", "id": str(RENEWAL)}]),
            now - timedelta(hours=2),
        )
