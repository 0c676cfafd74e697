"""The header that names a record's organization for scheduling: every producer of ours sets it,
and a consumer serves its waiting records round robin by it (consumers/runtime/lanes.py;
docs/delivery.md, "Fair shares inside a consumer"). It orders records, and grants nothing: the
handler reads the organization from the value."""

from __future__ import annotations

from uuid import UUID

HEADER_ORGANIZATION = "contextcore-organization"
PLATFORM = "platform"
"""The lane of the platform's records (a document uploaded for every organization)."""


def organization_header(organization: UUID | None) -> tuple[str, bytes]:
    """The header for a record of ``organization`` (``None``: the platform's)."""
    return (
        HEADER_ORGANIZATION,
        str(organization if organization is not None else PLATFORM).encode(),
    )
