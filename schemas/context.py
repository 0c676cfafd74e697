"""The contracts of the context layer: requests, policies, items and briefs.

Field names and defaults follow the design (``spec/context-layer.md``). Budgets and limits are
strict non-negative integers: ``"5"`` and ``True`` are refused, never coerced. Whether a policy
may be *published* (zero budgets, unknown sources, options) is a separate rule that the registry
enforces; the models only keep every value parseable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

MAX_CONTEXT_ITEM_LIMIT = 999
"""The ceiling of ``ContextSourceSpec.limit``: one read's row bound minus one.

No source repeats the number."""
MAX_ENTITIES = 1_000
"""Refs one request may name: what is already in scope for one turn, not a search. Every list
a request holds is bounded: what a consumer makes of a request (models, a validation error per
malformed entry) grows with its lists, and a request is read 16 at a time (issue 32)."""
MAX_POLICY_SOURCES = 64
"""Sources one policy may name (the service knows seven)."""
MAX_SOURCE_OPTIONS = 64
"""Keys of one source's options (each source declares a handful)."""

ContextKind = Literal[
    "application",
    "conversation",
    "definition_summary",
    "dossier",
    "knowledge",
    "memory",
    "outreach",
    "outreach_thread",
    "personal_memory",
    "run_history",
]

CLASS_ORDER: tuple[ContextKind, ...] = (
    "conversation",
    "outreach_thread",
    "outreach",
    "personal_memory",
    "application",
    "dossier",
    "definition_summary",
    "knowledge",
    "memory",
    "run_history",
)
"""The ten fact owners, highest class first: budget order, default section order, and the winner
of a subject-key collision."""

assert set(CLASS_ORDER) == set(get_args(ContextKind))
assert len(CLASS_ORDER) == len(get_args(ContextKind))

StrictBudget = Annotated[int, Field(ge=0, strict=True)]


def _storable(text: str) -> str:
    """Text PostgreSQL can hold and UTF-8 can encode: no NUL byte, no lone surrogate."""
    if "\x00" in text:
        raise ValueError("holds a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate") from None
    return text


StorableText = Annotated[str, AfterValidator(_storable)]


class ResourceRef(BaseModel):
    """A row of the application: matching and dedupe use (kind, id), never the label.

    Every part is text a query parameter and a reply can carry: a ref holding a NUL byte or a
    lone surrogate is malformed, and the message boundary drops it like any malformed ref.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: StorableText
    id: StorableText
    label: StorableText | None = None


class ContextSubject(BaseModel):
    """The four fields the sources filter by; the tenancy of every read.

    All four are required, the last three nullable, as in the design: a caller states "no user"
    or "no definition" on purpose. A forgotten field must not silently widen a read (a null
    definition widens a memory read to every definition of the organization).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    organization_id: UUID
    user_id: UUID | None
    trigger_id: UUID | None
    definition_id: UUID | None


class ContextRequest(BaseModel):
    """What one turn asks for. The subject travels here, never in the policy.

    The query is text PostgreSQL can hold (the knowledge source searches it): a NUL byte makes
    the request invalid at the message boundary, never a source that fails mid-build.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: ContextSubject
    query: StorableText
    entities: Annotated[tuple[ResourceRef, ...], Field(max_length=MAX_ENTITIES)]
    run_id: UUID | None = None
    conversation_id: UUID | None = None


class ContextSourceSpec(BaseModel):
    """One source in a policy: its budget, its item cap and its options."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(max_length=200)]
    enabled: bool = True
    required: bool = False
    token_budget: StrictBudget
    limit: Annotated[int, Field(ge=0, le=MAX_CONTEXT_ITEM_LIMIT, strict=True)] | None = None
    options: Annotated[dict[str, Any], Field(max_length=MAX_SOURCE_OPTIONS)] = Field(
        default_factory=dict
    )


class ContextPolicy(BaseModel):
    """An admin-authored, frozen description of which sources a brief reads and how much."""

    model_config = ConfigDict(extra="forbid")

    sources: Annotated[list[ContextSourceSpec], Field(max_length=MAX_POLICY_SOURCES)]
    total_token_budget: StrictBudget = 0
    refresh_on_resume: bool = True
    page_order: Annotated[list[ContextKind], Field(max_length=len(get_args(ContextKind)))] = Field(
        default_factory=list
    )

    @field_validator("page_order")
    @classmethod
    def _no_kind_twice(cls, value: list[ContextKind]) -> list[ContextKind]:
        seen: set[str] = set()
        for kind in value:
            if kind in seen:
                raise ValueError(f"page_order names {kind!r} twice")
            seen.add(kind)
        return value


class ContextItem(BaseModel):
    """One fact a source returned. Only the packer turns items into prose."""

    model_config = ConfigDict(extra="forbid")

    source: str
    kind: ContextKind
    title: str
    body: str
    subject_key: str | None = None
    ref: ResourceRef | None = None
    body_refs: list[ResourceRef] = Field(default_factory=list)
    recorded_at: datetime | None = None
    tokens: StrictBudget = 0
    rank_in_section: int = 0


class ContextBrief(BaseModel):
    """The packed brief and the pressure it was packed under; the prompt itself is not stored."""

    model_config = ConfigDict(extra="forbid")

    text: str
    items: list[ResourceRef]
    tokens: int
    per_source_tokens: dict[str, int]
    dropped: dict[str, int]
    failed_sources: list[str]


KEPT = "kept"
"""A manifest entry's outcome for an item the brief holds."""
SOURCE_NOT_ENABLED = "source_not_enabled"
"""Dropped: no enabled spec of the policy names the item's source (the packer's step 1)."""
LOST_KEY_TO = "lost_key_to"
"""Dropped: an item earlier in pack order holds its subject key (step 3); the outcome reads
``lost_key_to:<source>:<kind>:<id>``, naming the winner (``lost_key_to:<source>`` when the winner
has no ref)."""
OVER_SOURCE_BUDGET = "over_source_budget"
"""Dropped: its charge does not fit what is left of its source's ``token_budget`` (step 4)."""
OVER_TOTAL_BUDGET = "over_total_budget"
"""Dropped: it fits its source's budget, but not what is left of the total (step 4)."""

ReadFailure = Literal["timeout", "error", "missing", "wrong_source"]
"""How a source read failed: its timeout, an exception, no such source in the process, or an
item that is not a ``ContextItem`` of that source."""


class ManifestEntry(BaseModel):
    """One item a source returned, and what the packer did with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    kind: ContextKind
    ref: str | None
    """``<kind>:<id>`` as the source gave it, written as stored or not."""
    subject_key: str | None
    tokens: int
    """What the item was charged against its source's budget (its section heading is charged
    to the total only): 0 for a dropped item. A source's kept entries add up to its
    ``per_source_tokens``."""
    outcome: str
    """:data:`KEPT`, or why it was dropped: :data:`SOURCE_NOT_ENABLED`, ``lost_key_to:…``,
    :data:`OVER_SOURCE_BUDGET`, :data:`OVER_TOTAL_BUDGET`."""


class FailedRead(BaseModel):
    """One enabled source that gave no items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    required: bool
    cause: ReadFailure
    timeout_ms: int | None = None
    """The read's time box, for ``timeout`` (the configured one: a manifest holds no measured
    time, so a rebuild gives the same bytes)."""
    error: str | None = None
    """The exception's class, for ``error``."""


class BriefManifest(BaseModel):
    """Why the brief holds what it holds: every item the sources returned with its outcome, in
    pack order (the items of a source no spec enables first, in the order they came), the
    sources that failed in policy order, the policy's fingerprint and the digest of the text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: list[ManifestEntry]
    failed_sources: list[FailedRead]
    policy_sha256: str
    """sha256 of the policy as canonical JSON (sorted keys, no spaces): one policy, one value
    whatever the order of its JSON keys."""
    brief_sha256: str
    """sha256 of the brief's text in UTF-8: what the model was given."""


def make_subject_key(ref: ResourceRef | None, attribute: str | None) -> str | None:
    """``<entity kind>:<entity id>:<attribute>``, or ``None`` when the ref or attribute is missing.

    Raises:
        ValueError: a part is empty or contains ``:``, which would make the delimiter ambiguous.
    """
    if ref is None or attribute is None:
        return None
    parts = {"kind": ref.kind, "id": ref.id, "attribute": attribute}
    for name, part in parts.items():
        if not part:
            raise ValueError(f"subject key {name} is empty")
        if ":" in part:
            raise ValueError(f"subject key {name} {part!r} contains ':'")
    return f"{ref.kind}:{ref.id}:{attribute}"
