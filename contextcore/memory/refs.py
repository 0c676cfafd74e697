"""Rules about the refs a memory names, that the write path and the read path share.

A stored ``subject_refs`` value is read element by element (:func:`parse_stored_refs`); a ref that
names the memory's own scope owner means the same as no ref (:func:`names_the_scope_owner`). The
tenant guard's drop rules (:func:`stored_subject`, :func:`drop_reason`) are the memory source's
at read and ``contextcore memory health``'s.
"""

from __future__ import annotations

import json
from uuid import UUID

from pydantic import ValidationError

from contextcore.refs import PROJECTIONS, parse_uuid
from schemas.memory import MemorySubjectRef


def parse_stored_refs(raw: object) -> tuple[list[MemorySubjectRef], int]:
    """The well-formed elements of a stored ``subject_refs`` value, and how many were refused.

    Each element is read alone: a key it does not know is ignored, and an element that is not
    an object or whose ``kind`` or ``id`` breaks the key-part rules is refused. The read path drops
    a memory with any refused element (an unfiltered memory would reach every member of the
    tenant); the write path keeps serving its chain.
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return [], 1
    if not isinstance(raw, list):
        return [], 1
    kept: list[MemorySubjectRef] = []
    refused = 0
    for element in raw:
        if not isinstance(element, dict):
            refused += 1
            continue
        known = {k: v for k, v in element.items() if k in MemorySubjectRef.model_fields}
        try:
            kept.append(MemorySubjectRef.model_validate(known))
        except ValidationError:
            refused += 1
    return kept, refused


def names_the_scope_owner(
    ref: MemorySubjectRef, scope: str, organization_id: UUID, user_id: UUID | None
) -> bool:
    """Whether ``ref`` names its memory's scope owner itself: kind ``organization`` with the
    organization, in organization scope; kind ``user`` with the user, in user scope (any
    spelling of the UUID).

    Such a ref means the same as no ref (CLARIFICATIONS 16, and item 8 makes the same key): the
    write path drops it and the read path treats a stored one the same way. No resolver owns
    these two kinds, so before, a memory written with one was dropped at every read
    (``unknown_kind``), the revision it superseded with it. Any other ref of the two kinds is
    refused (:data:`OWNER_KINDS`)."""
    try:
        named = UUID(ref.id)
    except ValueError:
        return False
    if scope == "organization":
        return ref.kind == "organization" and named == organization_id
    return ref.kind == "user" and user_id is not None and named == user_id


OWNER_KINDS = ("organization", "user")
"""Ref kinds that name a scope owner: no resolver owns them. A ref of one of them that is not
the memory's own scope owner (a user named in organization scope, another organization) is
refused as ``invalid_input``: it would be dropped at every read, and a ref naming the asking
user in organization scope is not the same as no ref (that would make a user's fact visible to
the whole organization under the organization's key)."""


DropReason = str
"""``malformed_ref`` (a stored element the parser refuses), ``unknown_kind`` (no resolver owns
it), ``unresolved_ref`` (not a row of this organization: another tenant's, deleted, missing)."""


def stored_subject(
    raw: object, scope: str, organization_id: UUID, user_id: UUID | None
) -> tuple[MemorySubjectRef | None, bool]:
    """The subject a stored ``subject_refs`` value names (``None``: the memory is about its
    scope's owner), and whether the value is malformed (the memory is then dropped). A ref naming
    the memory's own scope owner means no ref (CLARIFICATIONS 16); ``user_id`` is the memory's
    user (user scope)."""
    refs, refused = parse_stored_refs(raw)
    if refused or len(refs) > 1:  # V1 resolves one subject per memory
        return None, True
    ref = refs[0] if refs else None
    if ref is not None and names_the_scope_owner(ref, scope, organization_id, user_id):
        return None, False  # stored before the write path dropped it
    return ref, False


def drop_reason(ref: MemorySubjectRef | None, resolved: set[tuple[str, UUID]]) -> DropReason | None:
    """Why the tenant guard drops a memory about ``ref`` (``None``: it is kept)."""
    if ref is None:
        return None
    if ref.kind not in PROJECTIONS:
        return "unknown_kind"
    row_id = parse_uuid(ref.id)
    if row_id is None or (ref.kind, row_id) not in resolved:
        return "unresolved_ref"
    return None
