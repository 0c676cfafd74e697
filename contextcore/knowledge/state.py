"""A knowledge source as ingestion sees it, and what each of its steps answers: the types the
domain's logic (ingest.py, embed.py) and the store (store.py, the PostgreSQL adapter) share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from contextcore.knowledge.extract import Section

Status = Literal["pending", "ready", "failed"]


@dataclass(frozen=True)
class SourceState:
    id: UUID
    organization_id: UUID | None
    title: str
    status: Status
    status_reason: str | None
    generation: int
    chunk_count: int | None
    updated_at: datetime
    reply_to: str | None = None
    correlation_id: str | None = None
    upload_key: str | None = None
    media_type: str | None = None
    sections: list[Section] | None = None
    """The extracted text (``None`` until extraction succeeded for this generation)."""


@dataclass(frozen=True)
class Superseded:
    """An upload whose generation a later upload (or retry) of the same document replaced.

    The source row has one uploader's address, the latest one's: from then on the source's
    statuses (``ready``, ``failed``, the sweep's) answer the later upload only, and this one
    would wait for ever. It is answered ``superseded`` instead, a final status.
    """

    source_id: UUID
    by_generation: int
    """The source's generation that replaced it."""
    generation: int | None = None
    """The generation replaced (``None`` when a redelivered upload no longer knows it)."""
    reply_to: str | None = None
    correlation_id: str | None = None

    @property
    def reason(self) -> str:
        return (
            "a later upload or retry of the same document replaced this one "
            f"(generation {self.by_generation})"
        )


@dataclass(frozen=True)
class Accepted:
    """A generation started by :func:`~.store.accept` or :func:`~.store.restart_generation`."""

    source_id: UUID
    generation: int
    replaced: Superseded | None
    """The generation it replaced when that one was still pending and its uploader waits on
    another address than this one's; ``None`` otherwise."""


@dataclass(frozen=True)
class BatchResult:
    inserted: int
    model_ready: bool
    """This batch completed the generation under its model."""
    source: SourceState | None
    """The source, when this batch made it ready (its uploader is told)."""
    stale: bool = False
    """The batch belongs to an older generation, or its model's row is no longer pending."""
    deleted: SourceState | None = None
    """The source was deleted while pending, and its uploader waits: it is told (failed, with
    :data:`DELETED`), by the first batch that finds the source gone only."""
    failed: SourceState | None = None
    """The store refused this batch for good, and this batch failed the source (its uploader is
    told the reason)."""


DELETED = "the document was deleted"
"""The reason a source deleted while pending is failed with (its uploader is told)."""
