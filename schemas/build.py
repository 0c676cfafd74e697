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

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from contextcore.models import ContextBrief, ContextPolicy, ContextRequest, ResourceRef

SCHEMA_VERSION = 1

KAFKA_TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"


def _not_dot_names(name: str) -> str:
    if name in {".", ".."}:
        raise ValueError("'.' and '..' are not Kafka topic names")
    return name


TopicName = Annotated[str, Field(pattern=KAFKA_TOPIC_PATTERN), AfterValidator(_not_dot_names)]
CorrelationId = Annotated[str, Field(min_length=1, max_length=200)]

ErrorCode = Literal[
    "invalid_request",  # the message is not a valid request of a known version
    "policy_rejected",  # the policy fails admission
    "required_source_failed",  # a required source failed; the run must fail
    "internal_error",  # a bug; the request may be retried
]


class BuildRequestV1(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    correlation_id: CorrelationId
    reply_to: TopicName
    request: ContextRequest
    policy: ContextPolicy
    resumed_after_wait: bool = False
    """The caller resumes a run after a wait: with ``policy.refresh_on_resume`` false the reply
    is ``reuse_previous`` and no brief is built (the caller keeps the one it holds)."""


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: ErrorCode
    message: str
    details: list[str] = Field(default_factory=list)


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

    @classmethod
    def ok(
        cls, correlation_id: str, brief: ContextBrief, *, dropped_entities: int = 0
    ) -> BuildReplyV1:
        return cls(
            correlation_id=correlation_id,
            status="ok",
            brief=brief,
            dropped_entities=dropped_entities,
        )

    @classmethod
    def failed(cls, correlation_id: str, error: ErrorInfo) -> BuildReplyV1:
        return cls(correlation_id=correlation_id, status="error", error=error)


class DeadLetterV1(BaseModel):
    """What lands on ``<topic>.dlt``: enough to find, read and replay the original record."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    topic: str
    partition: int
    offset: int
    reason: str
    consumer_group: str
    payload: str
    """The original value, decoded as UTF-8 with replacement characters where it was not."""


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
        if "entities" in request:
            entities, dropped = split_entities(request["entities"])
            request["entities"] = [entity.model_dump() for entity in entities]
        data = {**data, "request": request}
    return BuildRequestV1.model_validate(data), dropped


def reply_address(data: Any) -> tuple[str, str] | None:
    """``(reply_to, correlation_id)`` of a message that failed validation, when both are usable."""
    if not isinstance(data, dict):
        return None
    reply_to, correlation_id = data.get("reply_to"), data.get("correlation_id")
    try:
        address = _ReplyAddress(reply_to=reply_to, correlation_id=correlation_id)
    except ValidationError:
        return None
    return address.reply_to, address.correlation_id


class _ReplyAddress(BaseModel):
    reply_to: TopicName
    correlation_id: CorrelationId
