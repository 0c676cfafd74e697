"""The embedder's logic on an in-memory chunk store (the port of contextcore/knowledge/embed.py);
the PostgreSQL adapter is tested with the knowledge pipeline against the real database."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

import pytest

from contextcore.knowledge.chunk import Chunk
from contextcore.knowledge.embed import BatchRefused, Embedder, UnknownModel
from contextcore.knowledge.state import BatchResult, SourceState

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000a1")
SOURCE = uuid.UUID("7b000000-0000-4000-8000-0000000000b1")


class LengthEncoder:
    """A vector per text: its length and its first letter's code."""

    dimensions = 2

    def __init__(self, model: str) -> None:
        self.model = model
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return [[float(len(t)), float(ord(t[0]))] for t in texts]


class MemoryChunks:
    def __init__(self, *, refuse: bool = False) -> None:
        self.kept: list[tuple[UUID | None, UUID, str, int, list[tuple[Chunk, list[float]]]]] = []
        self.refuse = refuse
        self.failed: list[tuple[UUID | None, UUID, int, str]] = []

    async def store_batch(
        self,
        organization_id: UUID | None,
        source_id: UUID,
        model: str,
        generation: int,
        chunks: Sequence[Chunk],
        vectors: Sequence[Sequence[float]],
    ) -> BatchResult:
        if self.refuse:
            raise BatchRefused("the database refused one of its passages")
        pairs = [(chunk, list(vector)) for chunk, vector in zip(chunks, vectors, strict=True)]
        self.kept.append((organization_id, source_id, model, generation, pairs))
        return BatchResult(inserted=len(pairs), model_ready=False, source=None)

    async def fail(
        self, organization_id: UUID | None, source_id: UUID, generation: int, reason: str
    ) -> SourceState | None:
        self.failed.append((organization_id, source_id, generation, reason))
        return SourceState(
            id=source_id,
            organization_id=organization_id,
            title="Guide",
            status="failed",
            status_reason=reason,
            generation=generation,
            chunk_count=None,
            updated_at=datetime.now(UTC),
        )


def chunk(ordinal: int, text: str) -> Chunk:
    return Chunk(ordinal=ordinal, section="Guide", text=text, tokens=len(text))


async def test_each_chunk_is_kept_with_its_own_vector_under_the_batchs_model_and_scope() -> None:
    store = MemoryChunks()
    small, large = LengthEncoder("small"), LengthEncoder("large")
    embedder = Embedder(store, [small, large])
    batch = [chunk(0, "alpha"), chunk(1, "be"), chunk(2, "gamma ray")]
    result = await embedder.embed(ORG, SOURCE, 3, "large", batch)
    assert result.inserted == 3
    assert (small.calls, large.calls) == ([], [["alpha", "be", "gamma ray"]])
    [(organization, source, model, generation, pairs)] = store.kept
    assert (organization, source, model, generation) == (ORG, SOURCE, "large", 3)
    assert pairs == [
        (batch[0], [5.0, ord("a")]),
        (batch[1], [2.0, ord("b")]),
        (batch[2], [9.0, ord("g")]),
    ]


async def test_a_platform_batch_is_stored_in_the_platform_scope() -> None:
    store = MemoryChunks()
    await Embedder(store, [LengthEncoder("m")]).embed(None, SOURCE, 1, "m", [chunk(0, "x")])
    assert store.kept[0][0] is None


async def test_a_batch_for_a_model_this_process_lacks_is_refused_before_anything_is_kept() -> None:
    store = MemoryChunks()
    encoder = LengthEncoder("m")
    with pytest.raises(UnknownModel, match="not 'other'"):
        await Embedder(store, [encoder]).embed(ORG, SOURCE, 1, "other", [chunk(0, "x")])
    assert (store.kept, encoder.calls) == ([], [])


async def test_a_batch_the_store_refuses_for_good_fails_its_source_at_once() -> None:
    """Not a retry into a dead letter while the source waits an hour for the sweep."""
    store = MemoryChunks(refuse=True)
    result = await Embedder(store, [LengthEncoder("m")]).embed(ORG, SOURCE, 2, "m", [chunk(0, "x")])
    reason = "the document cannot be stored: the database refused one of its passages"
    assert store.failed == [(ORG, SOURCE, 2, reason)]
    assert result.failed is not None
    assert result.failed.status_reason == reason
    assert (result.inserted, result.source) == (0, None)
