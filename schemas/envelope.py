"""The envelope every request topic shares, and the dead-letter record of every topic.

A request names where its answer goes (``reply_to``) and how the caller recognises it
(``correlation_id``); every reply carries the same ``correlation_id``. Versions are explicit: a
consumer refuses a ``schema_version`` it does not know instead of guessing.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

KAFKA_TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"


def _not_dot_names(name: str) -> str:
    if name in {".", ".."}:
        raise ValueError("'.' and '..' are not Kafka topic names")
    return name


TopicName = Annotated[str, Field(pattern=KAFKA_TOPIC_PATTERN), AfterValidator(_not_dot_names)]
CorrelationId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$")]
"""Printable ASCII: it travels in a Kafka header and in logs."""


class Envelope(BaseModel):
    """The fields every request carries: the answer's address."""

    model_config = ConfigDict(extra="forbid")

    correlation_id: CorrelationId
    reply_to: TopicName


class _ReplyAddress(BaseModel):
    reply_to: TopicName
    correlation_id: CorrelationId


def reply_address(data: Any) -> tuple[str, str] | None:
    """``(reply_to, correlation_id)`` of a decoded message that failed validation, when both
    are usable; ``None`` otherwise (the record then goes to the dead-letter topic)."""
    if not isinstance(data, dict):
        return None
    try:
        address = _ReplyAddress(
            reply_to=data.get("reply_to"), correlation_id=data.get("correlation_id")
        )
    except ValidationError:
        return None
    return address.reply_to, address.correlation_id


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate, which UTF-8 cannot encode.

    JSON may escape one (``"\\ud800"``) and Python decodes it into such a ``str``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def printable(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so it can always be encoded: an
    error message quoting such input must still be serialisable."""
    if has_lone_surrogate(text):
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


class DeadLetterV1(BaseModel):
    """What lands on ``<topic>.dlt``: enough to find, read and replay the original record."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Annotated[int, Field(ge=1, le=1)] = 1
    topic: str
    partition: int
    offset: int
    """Where the record first arrived (a retried record is re-published in its topic)."""
    consumer_group: str
    cause: str
    """A short label: ``not_json``, ``invalid``, ``gave_up``, ``reply_refused`` …"""
    reason: str
    attempts: int = 1
    key: str | None = None
    payload: str
    """The original value decoded as UTF-8 (replacement characters where it was not), cut to
    the consumer's ``dead_letter_payload_bytes``."""
    payload_bytes: int
    """The size of the original value."""
    payload_sha256: str
    payload_truncated: bool = False
