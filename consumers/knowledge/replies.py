"""A knowledge source's state as the status reply its uploader reads: the upload, embedding and
sweep consumers all answer through these, so a status means the same whoever sends it."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from consumers.runtime.records import Reply
from contextcore.knowledge.state import SourceState, Superseded
from schemas.envelope import printable
from schemas.upload import UploadStatusV1


def status_of(state: SourceState, correlation_id: str) -> UploadStatusV1:
    return UploadStatusV1(
        correlation_id=correlation_id,
        status=state.status,
        source_id=state.id,
        generation=state.generation,
        chunks=state.chunk_count,
        reason=printable(state.status_reason) if state.status_reason else None,
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
