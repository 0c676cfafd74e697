"""The upload topic: an admin's document for the knowledge base, and the status replies it gets.

Wire shape of an upload (JSON)::

    {"schema_version": 1, "correlation_id": "…", "reply_to": "topic",
     "scope": "organization", "organization_id": "uuid", "title": "Pricing",
     "media_type": "text/markdown", "idempotency_key": "…",
     "uri": "docs://handbook/pricing", "content": {"text": "# Pricing …"}}

The document is either inline (``content``: ``text``, or ``base64`` for binary formats such as
PDF) with a ``uri`` naming it, or an object the consumer reads: ``object`` is ``s3://bucket/key``
(read through the S3 API) or ``file:///path`` (under the consumer's configured root only). The
source's identity is ``(organization, uri)``, or ``(organization, object key)`` for S3; a second
upload with the same identity updates that source and re-ingests it.

Status replies go to ``reply_to`` with the ``correlation_id``: ``pending`` when the upload is
accepted, then ``ready`` (with the chunk count) or ``failed`` (with the reason); ``rejected``
when the upload itself is invalid; ``superseded`` when a later upload of the same document
replaced this one before it was final (the reason names the generation that replaced it).
Delivery is at least once: a status may arrive twice.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, model_validator

from schemas.envelope import CorrelationId, Envelope, TopicName
from schemas.position import Position

SCHEMA_VERSION = 1
MAX_INLINE_CHARS = 900_000
"""Inline content must fit one Kafka record; larger documents go through ``object``."""

Text = Annotated[str, Field(min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]+$")]
Key = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x20-\x7e]+$")]
MAX_ADDRESS_BYTES = 2_000
"""A source's identity (``uri``, ``object``) is a key of a unique btree index, whose rows hold
at most 2,704 bytes: 2,000 characters of CJK (6,000 bytes) passed a bound in characters and were
refused by PostgreSQL, so the bound is in UTF-8 bytes."""


def _address_bytes(address: str) -> str:
    size = len(address.encode("utf-8", "surrogatepass"))
    if size > MAX_ADDRESS_BYTES:
        raise ValueError(f"is {size:,} bytes in UTF-8, over {MAX_ADDRESS_BYTES:,}")
    return address


Address = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ADDRESS_BYTES, pattern=r"^[^\x00-\x1f\x7f]+$"),
    AfterValidator(_address_bytes),
]


class InlineContent(BaseModel):
    """Exactly one of ``text`` (UTF-8 text formats) or ``base64`` (any bytes)."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Field(max_length=MAX_INLINE_CHARS)] | None = None
    base64: Annotated[str, Field(max_length=MAX_INLINE_CHARS)] | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.text is None) == (self.base64 is None):
            raise ValueError("content holds exactly one of text or base64")
        return self


class UploadRequestV1(Envelope):
    schema_version: Literal[1] = 1
    action: Literal["upload"] = "upload"
    scope: Literal["organization", "platform"]
    organization_id: UUID | None = None
    """Required for the organization scope, absent for the platform's shared documents."""
    title: Text
    media_type: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e ]+$")]
    idempotency_key: Key
    """The same key twice is the same upload: it is ingested once and answered again."""
    uri: Address | None = None
    object: Address | None = None
    content: InlineContent | None = None

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if (self.scope == "organization") != (self.organization_id is not None):
            raise ValueError(
                "organization_id is required for, and only for, the organization scope"
            )
        if (self.content is None) == (self.object is None):
            raise ValueError("an upload carries exactly one of content or object")
        if self.content is not None and self.uri is None:
            raise ValueError("inline content needs a uri naming the document (its identity)")
        if self.object is not None:
            if not self.object.startswith(("s3://", "file://")):
                raise ValueError("object must be an s3:// or file:// address")
            if self.uri is not None:
                raise ValueError("an object is its own identity: give no uri with it")
        return self


class ReingestRequestV1(BaseModel):
    """An admin command's request (``contextcore knowledge retry`` and ``switch prepare``):
    ingest a stored source again from its stored text.

    ``models`` absent: a new generation under every model the scope embeds with (a retry).
    ``models`` given: the current generation under these models only, while the live model's
    chunks keep serving (step 1 of a model switch).
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    action: Literal["reingest"]
    scope: Literal["organization", "platform"]
    organization_id: UUID | None = None
    source_id: UUID
    models: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=200)]],
            Field(min_length=1, max_length=4),
        ]
        | None
    ) = None
    idempotency_key: Key
    correlation_id: CorrelationId | None = None
    reply_to: TopicName | None = None

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if (self.scope == "organization") != (self.organization_id is not None):
            raise ValueError("organization_id is required for the organization scope only")
        if (self.reply_to is None) != (self.correlation_id is None):
            raise ValueError("reply_to and correlation_id come together")
        return self


class UploadTopicV1(
    RootModel[Annotated[UploadRequestV1 | ReingestRequestV1, Field(discriminator="action")]]
):
    """What the upload topic carries: an upload (``action`` absent or ``upload``) or a
    re-ingestion (``action: reingest``)."""


def parse_upload_topic(data: Any) -> UploadRequestV1 | ReingestRequestV1:
    """Raises ValidationError. An upload may omit ``action`` (version 1 began without it)."""
    if isinstance(data, dict) and "action" not in data:
        data = {**data, "action": "upload"}
    return UploadTopicV1.model_validate(data).root


UploadStatus = Literal["pending", "ready", "failed", "rejected", "superseded"]
"""``pending`` is the only status that is not final. ``superseded``: a later upload (or retry)
of the same document started the source's next generation while this one's was pending; the
source's statuses answer that later upload from then on, so this one is told it was replaced."""


class UploadStatusV1(BaseModel):
    """One status of one upload. ``source_id`` is absent only for ``rejected``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    correlation_id: str
    status: UploadStatus
    source_id: UUID | None = None
    generation: int | None = None
    chunks: int | None = None
    """The chunk count under the live model (``ready``)."""
    reason: str | None = None
    """Why it ``failed``, was ``rejected`` or ``superseded``."""
    details: list[str] = Field(default_factory=list)
    position: Position | None = None
    """With ``ready``: where the database's log stood once the source was ready; a build
    request naming it as ``read_after`` finds the document."""


MAX_CHUNK_CHARS = 65_536
"""The longest chunk text: 8 characters per word piece of the largest window the settings
allow (8,192 pieces); the chunker cuts every chunk under it (contextcore/knowledge/chunk.py)."""
MAX_SECTION_CHARS = 4_000
"""The longest heading path of a chunk (the chunker cuts them at 1,000)."""
MAX_BATCH_CHUNKS = 512
MAX_BATCH_CHARS = 1_000_000
"""The most characters of text and headings in one embedding batch: what a batch may make an
encoder do is bounded by the batch, not by the record the broker took (the upload consumer
cuts batches under it and under the record limit)."""


class EmbedChunkV1(BaseModel):
    """One chunk of a document on the wire: the upload consumer writes its chunks so, and the
    embedding group reads them back as chunks. ``Chunk`` (contextcore/knowledge/chunk.py) has the
    same four fields; the consumers convert at the edge, so this package imports no domain."""

    model_config = ConfigDict(extra="forbid")

    ordinal: Annotated[int, Field(ge=0, le=10_000_000)]
    section: Annotated[str, Field(max_length=MAX_SECTION_CHARS)]
    text: Annotated[str, Field(min_length=1, max_length=MAX_CHUNK_CHARS)]
    tokens: Annotated[int, Field(ge=1, le=100_000)]

    @property
    def chars(self) -> int:
        return len(self.section) + len(self.text)


class EmbedBatchV1(BaseModel):
    """Chunks of one generation of one source, to embed under one model (an internal topic:
    the upload consumer writes it, the embedding group reads it)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    organization_id: UUID | None
    source_id: UUID
    generation: Annotated[int, Field(ge=1)]
    embedding_model: Annotated[str, Field(min_length=1, max_length=200)]
    chunks: Annotated[list[EmbedChunkV1], Field(min_length=1, max_length=MAX_BATCH_CHUNKS)]

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        chars = sum(chunk.chars for chunk in self.chunks)
        if chars > MAX_BATCH_CHARS:
            raise ValueError(f"the batch holds {chars} characters, over {MAX_BATCH_CHARS}")
        return self
