"""The application rows (CRM, product, intelligence) a request or a memory names, read through
``contextcore_read_application`` (migration 00029) in the organization's scope: one statement for
every kind, an array of ids per kind, whatever the number of refs (CLARIFICATIONS 14).

Two readers share it: the application source (the rows of ``request.entities``) and the memory
tenant guard (:func:`resolve`, :func:`resolve_refs`: which subjects of memories name a row of this
organization), on the build path and in ``contextcore memory health``. The kinds and their
fields are :data:`contextcore.refs.PROJECTIONS`.
"""

from __future__ import annotations

from uuid import UUID

from contextcore.refs import PROJECTIONS, parse_uuid
from contextcore.storage.tenancy import ScopedRead, TenantConnection, TenantDatabase
from schemas.memory import MemorySubjectRef

READ = ScopedRead(
    "application.read",
    "-- application.read: the named rows of this tenant, every kind in one statement (00029)\n"
    "SELECT kind, id, fields, recorded_at\n"
    "FROM contextcore_read_application($1, $2, $3, $4, $5, $6, $7, $8, $9)",
)
KINDS = tuple(PROJECTIONS)  # the order of the function's arrays, $2 to $9


def _wanted(refs: list[MemorySubjectRef]) -> list[list[UUID]] | None:
    """The ids to resolve, one array per kind the application source resolves (``None``:
    nothing to resolve)."""
    wanted: dict[str, set[UUID]] = {}
    for ref in refs:
        if ref.kind in PROJECTIONS and (row_id := parse_uuid(ref.id)) is not None:
            wanted.setdefault(ref.kind, set()).add(row_id)
    if not wanted:
        return None
    return [sorted(wanted.get(kind, ())) for kind in KINDS]


async def resolve(tenant: TenantConnection, refs: list[MemorySubjectRef]) -> set[tuple[str, UUID]]:
    """The ``(kind, id)`` of ``refs`` that name a row of this organization: one statement for
    every kind the application source resolves, never one per memory (inside a scope's
    transaction: ``contextcore memory health``)."""
    arrays = _wanted(refs)
    if arrays is None:
        return set()
    return {(found["kind"], found["id"]) for found in await tenant.read(READ, *arrays)}


async def resolve_refs(
    database: TenantDatabase, organization_id: UUID, refs: list[MemorySubjectRef]
) -> set[tuple[str, UUID]]:
    """:func:`resolve` as one scoped read of its own (the build path)."""
    arrays = _wanted(refs)
    if arrays is None:
        return set()
    rows = await database.read(READ, organization_id, *arrays)
    return {(found["kind"], found["id"]) for found in rows}
