"""One embedding batch: encode its chunks, then store them (the embedding group's work).

The encode runs in a worker thread before the transaction, so a batch holds its per-model
row's lock only while it inserts; batches in flight at once share one encode
(:class:`~.encoder.CoalescingEncoder`). :func:`~.store.store_batch` makes a redelivered batch insert
nothing and a batch of a superseded generation change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from contextcore.errors import ContextcoreError
from contextcore.knowledge import store
from contextcore.knowledge.chunk import Chunk
from contextcore.knowledge.encoder import CoalescingEncoder, Encoder
from contextcore.storage.tenancy import PLATFORM, TenantDatabase


class UnknownModel(ContextcoreError, LookupError):
    """The batch is for a model this process does not encode with."""


class Embedder:
    def __init__(self, database: TenantDatabase, encoders: Sequence[Encoder]) -> None:
        self.database = database
        self.encoders = {encoder.model: CoalescingEncoder(encoder) for encoder in encoders}

    async def embed(
        self,
        organization_id: UUID | None,
        source_id: UUID,
        generation: int,
        model: str,
        chunks: Sequence[Chunk],
    ) -> store.BatchResult:
        encoder = self.encoders.get(model)
        if encoder is None:
            raise UnknownModel(f"this process embeds with {sorted(self.encoders)}, not {model!r}")
        vectors = await encoder.encode([chunk.text for chunk in chunks])
        scope = organization_id if organization_id is not None else PLATFORM
        async with self.database.writing(scope) as tenant:
            return await store.store_batch(tenant, source_id, model, generation, chunks, vectors)
