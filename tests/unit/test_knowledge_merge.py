"""Two scopes' rankings under two models, merged by rank (CLARIFICATIONS 17)."""

from __future__ import annotations

import uuid

from contextcore.knowledge.adapters.search import Hit, merge


def hit(chunk: int, document: int, rank: int, score: float) -> Hit:
    return Hit(
        chunk_id=chunk,
        source_id=uuid.UUID(int=document),
        organization_id=None,
        title=f"doc {document}",
        section="",
        ordinal=0,
        text=f"chunk {chunk}",
        tokens=3,
        embedding_model="m",
        similarity=score,
        lexical=0.0,
        score=score,
        document_rank=rank,
    )


def test_two_rankings_interleave_by_rank_and_keep_each_documents_chunks_together() -> None:
    own = [hit(1, 1, 1, 0.2), hit(2, 1, 1, 0.1), hit(3, 2, 2, 0.1)]
    platform = [hit(10, 10, 1, 0.9), hit(11, 11, 2, 0.8), hit(12, 12, 3, 0.7)]
    merged = merge([own, platform], limit=4)
    assert [(h.chunk_id, h.document_rank) for h in merged] == [
        (1, 1),
        (2, 1),  # the organization's first document brings both its chunks
        (10, 2),  # scores of two models are never compared: the platform's best comes second
        (3, 3),
        (11, 4),
    ]


def test_one_ranking_is_returned_as_it_is() -> None:
    only = [hit(1, 1, 1, 0.5), hit(2, 2, 2, 0.4)]
    assert merge([only], limit=1) == only
