"""The build-request topic: a request for a brief, and its reply (a brief or an error).

Delivery is at least once: a reply may arrive twice, and the client matches replies to requests
by ``correlation_id`` and ignores any it is not waiting for.

Wire shape of a request (JSON)::

    {"schema_version": 1, "correlation_id": "…", "reply_to": "topic",
     "request": {ContextRequest}, "policy": {ContextPolicy}}

``request.entities`` is read leniently at this boundary: a malformed entry is dropped and
counted, valid refs reach ``ContextRequest.entities``, and the rest of the request is kept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.context import (
    MAX_ENTITIES,
    BriefManifest,
    ContextBrief,
    ContextPolicy,
    ContextRequest,
    ResourceRef,
)
from schemas.envelope import Envelope
from schemas.position import Position

SCHEMA_VERSION = 1

ErrorCode = Literal[
    "invalid_request",  # the message is not a valid request of a known version
    "policy_rejected",  # the policy fails admission
    "required_source_failed",  # a required source failed; the run must fail
    "internal_error",  # a bug; the request may be retried
    "throttled",  # the organization is over its build rate: try again after retry_after_ms
]


class BuildRequestV1(Envelope):
    """A request for one brief; the reply goes to ``reply_to`` with ``correlation_id``."""

    schema_version: Literal[1] = 1
    request: ContextRequest
    policy: ContextPolicy
    resumed_after_wait: bool = False
    """The caller resumes a run after a wait: with ``policy.refresh_on_resume`` false the reply
    is ``reuse_previous`` and no brief is built (the caller keeps the one it holds)."""
    explain: bool = False
    """Answer with the brief's manifest too: why each item is in the brief or not (off by
    default: the hot path builds none)."""
    read_after: Position | None = None
    """Read-your-writes: the ``position`` of a memory answer or of an upload's ``ready`` status
    (the latest the caller holds). The sources then read a database that has that write (a
    replica that has replayed this far, else the primary); without it a replica may serve a
    state up to its lag old (docs/scaling.md). A position the primary never wrote is read as
    none."""


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: ErrorCode
    message: str
    details: list[str] = Field(default_factory=list)
    retry_after_ms: int | None = Field(default=None, ge=0)
    """With ``throttled``: how long to wait before the request would be admitted."""


class BuildReplyV1(BaseModel):
    """``ok`` carries ``brief``, ``error`` carries ``error``, ``reuse_previous`` carries neither."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    correlation_id: str
    status: Literal["ok", "error", "reuse_previous"]
    brief: ContextBrief | None = None
    error: ErrorInfo | None = None
    dropped_entities: int = 0
    """Malformed entries of ``request.entities`` dropped at the message boundary."""
    manifest: BriefManifest | None = None
    """With ``status`` ok, when the request asked for it (``explain``)."""

    @classmethod
    def ok(
        cls,
        correlation_id: str,
        brief: ContextBrief,
        *,
        dropped_entities: int = 0,
        manifest: BriefManifest | None = None,
    ) -> BuildReplyV1:
        return cls(
            correlation_id=correlation_id,
            status="ok",
            brief=brief,
            dropped_entities=dropped_entities,
            manifest=manifest,
        )

    @classmethod
    def failed(cls, correlation_id: str, error: ErrorInfo) -> BuildReplyV1:
        return cls(correlation_id=correlation_id, status="error", error=error)


def split_entities(raw: Any) -> tuple[list[ResourceRef], int]:
    """Valid refs of a raw ``entities`` value, and the count of dropped malformed entries."""
    if not isinstance(raw, list):
        return [], 0 if raw is None else 1
    kept: list[ResourceRef] = []
    dropped = 0
    for entry in raw:
        try:
            kept.append(ResourceRef.model_validate(entry))
        except ValidationError:
            dropped += 1
    return kept, dropped


def parse_build_request(data: Any) -> tuple[BuildRequestV1, int]:
    """Validate a decoded JSON message; returns the request and the count of dropped entities.

    Raises:
        ValidationError: anything but ``request.entities`` is malformed.
    """
    dropped = 0
    if isinstance(data, dict) and isinstance(data.get("request"), dict):
        request = dict(data["request"])
        raw = request.get("entities")
        if isinstance(raw, list) and len(raw) > MAX_ENTITIES:
            pass  # more than a request may name: refused whole by the model, no entry read
        elif "entities" in request:
            entities, dropped = split_entities(raw)
            request["entities"] = [entity.model_dump() for entity in entities]
        data = {**data, "request": request}
    return BuildRequestV1.model_validate(data), dropped
