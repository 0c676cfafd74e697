"""A knowledge source's state as the status reply its uploader reads: the upload, embedding and
sweep consumers all answer through these, so a status means the same whoever sends it.

A status goes out one of two ways, and each checks the reply-topic rule
(:mod:`broker.reply_topics`) on the address, which a source row may have kept from before the
rule, or from other settings: as a record's outcome (:func:`reply`; the delivery refuses a
forbidden topic and dead-letters the record), or, when no record of the uploader's is being
answered (a superseded upload, a swept source), through :func:`tell`.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from broker.reply_topics import ReplyTopics
from broker.tracing import trace_headers
from consumers.runtime.records import Reply
from consumers.runtime.transport import Publisher, PublishError
from contextcore.knowledge.state import SourceState, Superseded
from schemas.envelope import printable
from schemas.upload import UploadStatusV1


def status_of(
    state: SourceState, correlation_id: str, *, position: str | None = None
) -> UploadStatusV1:
    """``position``: where the primary's log stood once the source was ready (``ready``
    only)."""
    return UploadStatusV1(
        correlation_id=correlation_id,
        status=state.status,
        source_id=state.id,
        generation=state.generation,
        chunks=state.chunk_count,
        reason=printable(state.status_reason) if state.status_reason else None,
        position=position if state.status == "ready" else None,
    )


def superseded(replaced: Superseded, correlation_id: str) -> UploadStatusV1:
    """The final status of an upload a later one replaced (the source's own statuses now
    answer the later upload)."""
    return UploadStatusV1(
        correlation_id=correlation_id,
        status="superseded",
        source_id=replaced.source_id,
        generation=replaced.generation,
        reason=replaced.reason,
    )


def rejected(correlation_id: str, reason: str, details: list[str] | None = None) -> UploadStatusV1:
    return UploadStatusV1(
        correlation_id=correlation_id,
        status="rejected",
        reason=printable(reason)[:2_000],
        details=[printable(d)[:2_000] for d in (details or [])[:50]],
    )


def swept(source_id: UUID, reason: str, correlation_id: str) -> UploadStatusV1:
    """The final status of a source the sweep failed (pending too long)."""
    return UploadStatusV1(
        correlation_id=correlation_id,
        status="failed",
        source_id=source_id,
        reason=printable(reason),
    )


def _fallback(correlation_id: str) -> Callable[[str], UploadStatusV1]:
    return lambda reason: rejected(correlation_id, reason)


def reply(topic: str, correlation_id: str, message: UploadStatusV1) -> Reply:
    return Reply(topic, correlation_id, message, fallback=_fallback(correlation_id))


async def tell(
    publisher: Publisher, reply_topics: ReplyTopics, topic: str, message: UploadStatusV1
) -> str | None:
    """Publish ``message`` to ``topic`` outside a record's outcome: ``None`` once the broker has
    it, else why not (the rule refuses the topic, or the broker the record). Never retried: the
    caller logs the reason, and the uploader's client times out."""
    refused = reply_topics.refusal(topic)
    if refused is not None:
        return f"the reply-topic rule refuses it: {refused}"
    try:
        await publisher.publish(
            topic,
            message.model_dump_json().encode(),
            key=None,
            headers=[
                ("content-type", b"application/json"),
                ("correlation_id", message.correlation_id.encode()),
                *trace_headers(),
            ],
        )
    except PublishError as error:
        return str(error)
    return None
