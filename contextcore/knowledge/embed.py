"""One embedding batch: encode its chunks, then store them (the embedding group's work).

The encode runs in a worker thread before the transaction, so a batch holds its per-model
row's lock only while it inserts; batches in flight at once share one encode
(:class:`~.encoding.CoalescingEncoder`). :func:`~.store.store_batch` makes a redelivered batch
insert nothing and a batch of a superseded generation change nothing. A batch the store refuses
for good (:class:`BatchRefused`: a value it cannot hold) fails its source at once, with the
reason, instead of being retried into a dead letter while the source waits an hour for the
sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from uuid import UUID

from contextcore.knowledge.chunk import Chunk
from contextcore.knowledge.encoding import CoalescingEncoder, Encoder
from contextcore.knowledge.state import BatchResult, SourceState
from schemas.errors import ContextcoreError


class UnknownModel(ContextcoreError, LookupError):
    """The batch is for a model this process does not encode with."""


class BatchRefused(ContextcoreError):
    """The store will never take this batch (the reason says why, to a person)."""


class ChunkStore(Protocol):
    """Where an embedded batch is kept: PostgreSQL (:class:`~.store.PostgresChunkStore`), or
    memory in the unit tests."""

    async def store_batch(
        self,
        organization_id: UUID | None,
        source_id: UUID,
        model: str,
        generation: int,
        chunks: Sequence[Chunk],
        vectors: Sequence[Sequence[float]],
    ) -> BatchResult:
        """Store the chunks with their vectors in order, in the organization's scope (``None``:
        the platform's); a redelivered batch inserts nothing.

        Raises:
            BatchRefused: the store will never take it.
        """

    async def fail(
        self, organization_id: UUID | None, source_id: UUID, generation: int, reason: str
    ) -> SourceState | None:
        """Fail the generation with ``reason`` unless it is no longer pending; the source
        when this call failed it (its uploader is told), else ``None``."""


class Embedder:
    def __init__(self, chunks: ChunkStore, encoders: Sequence[Encoder]) -> None:
        self.chunks = chunks
        self.encoders = {encoder.model: CoalescingEncoder(encoder) for encoder in encoders}

    async def embed(
        self,
        organization_id: UUID | None,
        source_id: UUID,
        generation: int,
        model: str,
        chunks: Sequence[Chunk],
    ) -> BatchResult:
        """Encode the chunks (no connection held meanwhile), then store them.

        Raises:
            UnknownModel: the batch names a model this process does not encode with.
        """
        encoder = self.encoders.get(model)
        if encoder is None:
            raise UnknownModel(f"this process embeds with {sorted(self.encoders)}, not {model!r}")
        # the organization's lane: its batches take turns with the others' (issue 33)
        vectors = await encoder.encode([chunk.text for chunk in chunks], organization_id)
        try:
            return await self.chunks.store_batch(
                organization_id, source_id, model, generation, chunks, vectors
            )
        except BatchRefused as refused:
            reason = f"the document cannot be stored: {refused}"
            failed = await self.chunks.fail(organization_id, source_id, generation, reason)
            return BatchResult(0, False, None, failed=failed)
