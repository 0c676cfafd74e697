"""Hybrid search over ready knowledge chunks, by document: what the knowledge source
(``contextcore/sources/knowledge.py``) reads.

One read per live model: ``knowledge_search`` (migration 00017), SECURITY INVOKER, in the
subject's organization scope, which filters the organization explicitly, reads ready sources
only and chunks of the model the query was embedded with only, and refuses a scope whose live
model is another. Candidates come from the vector side and from the full text of the query;
documents are ranked by their best chunk (docs/knowledge.md, measured by ``bench/quality.py``).

Models per scope (CLARIFICATIONS 17): the live model of both scopes is read once, in one
statement, and the query is embedded with each model that is live (one encode when both scopes
share it, the usual case). An organization on a model of its own searches its documents under
it and the platform's under the platform's, in a second call, and the two rankings are merged
by rank: the scores of two models are not comparable, their ranks are. (The other way, every
platform document embedded under every model an organization uses, would multiply the
platform's storage and ingest by the organizations' choices.) A live model this process cannot
encode fails the source; a flip between the read and the search is searched again, once, in
a new transaction.

The order is total: the same rows give the same hits in the same order, whatever the rows'
physical order. ``knowledge_search`` (migration 00034) takes each scope's vector candidates by
distance then chunk id and its lexical ones by score then chunk id, ranks documents by score
then their first chunk's id and a document's chunks by score then id (chunks alone: by score
then id); :func:`merge` orders two models' hits by rank, then the ranking (the organization's
model first), then the position in it. (A tenant with an HNSW index of its own gets the index's
approximate candidates: the same while the index is the same, not a function of the rows alone.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from uuid import UUID

import asyncpg

from contextcore.cache import TenantCache
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.storage.tenancy import ScopedRead, TenantDatabase, TenantQuery
from schemas.errors import ContextcoreError

MAX_QUERY_CHARS = 2_000
MODEL_MOVED = "CC001"
"""SQLSTATE of ``knowledge_search`` when a scope's live model is not the query's."""


@dataclass(frozen=True)
class SearchTuning:
    """The ranking's constants (``bench/quality.py --tune`` chose them on the tuning set only;
    docs/knowledge.md)."""

    candidates: int = 40
    """Chunks each side (vector, full text) brings per scope."""
    lexical_weight: float = 0.4
    """The full-text score's weight for a question whose rarest word one chunk alone has; less
    as that word is commoner (migration 00022)."""
    later_chunk_penalty: float = 0.2
    ef_search: int = 200

    def arguments(self) -> tuple[int, float, float, int]:
        """The constants as ``knowledge_search`` takes them, after the query's own."""
        return self.candidates, self.lexical_weight, self.later_chunk_penalty, self.ef_search


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    source_id: UUID
    organization_id: UUID | None
    title: str
    section: str
    ordinal: int
    text: str
    tokens: int
    embedding_model: str
    similarity: float
    lexical: float
    score: float
    document_rank: int
    """The rank of the hit's document (of the hit itself when results are chunks), from 1."""


LIVE_MODELS = ScopedRead(
    "knowledge.live_models",
    "-- knowledge.live_models: the model each scope's searches embed with (00032)\n"
    "SELECT organization_model, platform_model FROM contextcore_read_knowledge_models($1)",
)

READ = ScopedRead(
    "knowledge.read",
    "-- knowledge.read: knowledge_search in the organization's scope, one statement (00032)\n"
    "SELECT chunk_id, source_id, organization_id, title, section, ordinal, text, tokens,\n"
    "       embedding_model, similarity, lexical, score, document_rank\n"
    "FROM contextcore_read_knowledge($1, $2, $3::vector, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
)

SEARCH = TenantQuery(
    "knowledge.search",
    """
-- knowledge.search: hybrid search of this organization and/or the platform (migration 00017).
SELECT chunk_id, source_id, organization_id, title, section, ordinal, text, tokens,
       embedding_model, similarity, lexical, score, document_rank
FROM knowledge_search($1, $2, $3::vector, $4, $5, $6, $7, $8, $9, $10, $11, $12)
""",
)


class ModelUnavailable(ContextcoreError, LookupError):
    """The scope's live model is not one this process encodes with."""


class ModelMoved(ContextcoreError):
    """A scope's live model flipped between the read and the search: search again."""


@dataclass(frozen=True)
class Scopes:
    """Which scopes a search reads, and the live model of each."""

    organization: str | None
    """The organization's live model, or ``None`` when its documents are not searched."""
    platform: str | None

    def by_model(self) -> dict[str, tuple[bool, bool]]:
        """Each model to search under: (include_platform, include_organization)."""
        calls: dict[str, tuple[bool, bool]] = {}
        if self.organization is not None:
            calls[self.organization] = (False, True)
        if self.platform is not None:
            own = calls.get(self.platform, (False, False))[1]
            calls[self.platform] = (True, own)
        return calls


LiveModels = tuple[str | None, str | None]
"""The organization's live model and the platform's (what the models cache keeps)."""

KNOWLEDGE_MODELS_CHANNEL = "contextcore_knowledge_models"
"""Where a write to ``knowledge_settings`` is told: the organization's id, or empty for the
platform's row (migration 00032)."""


async def live_models(
    database: TenantDatabase, organization_id: UUID, cache: TenantCache[LiveModels] | None = None
) -> LiveModels:
    """Both scopes' live models: from ``cache`` (invalidated by every write to
    ``knowledge_settings``, migration 00032), else one statement."""
    if cache is not None and (found := cache.get(organization_id)) is not None:
        return found
    generation = None if cache is None else cache.generation(organization_id)
    [row] = await database.read(LIVE_MODELS, organization_id)
    found = (row["organization_model"], row["platform_model"])
    if cache is not None and generation is not None:  # taken before the read
        cache.put(organization_id, found, generation=generation)
    return found


async def search(
    database: TenantDatabase,
    organization_id: UUID,
    vectors: QueryVectors,
    query: str,
    *,
    include_platform: bool,
    include_organization: bool,
    limit: int,
    per_document: int | None = 1,
    tuning: SearchTuning = SearchTuning(),
    models: TenantCache[LiveModels] | None = None,
) -> list[Hit]:
    """The best ``limit`` documents for ``query`` (their ``per_document`` best chunks each; with
    ``per_document=None``, the best ``limit`` chunks) in ``organization_id``'s scope.

    No connection is held while the query is embedded: the live models are one statement (or
    the ``models`` cache), the embedding is ``vectors``' (coalesced, cached), and each model's
    search is one statement.

    Raises:
        ModelUnavailable: a scope's live model is one ``vectors`` cannot encode with.
        ModelMoved: a live model flipped after it was read (``knowledge_search`` refused the
            query's); the cached models are dropped, search again.
    """
    text = query[:MAX_QUERY_CHARS]
    organization, platform = await live_models(database, organization_id, models)
    scopes = Scopes(
        organization if include_organization else None, platform if include_platform else None
    )
    rankings = []
    for model, (with_platform, own) in scopes.by_model().items():
        try:
            vector = await vectors.vector(organization_id, model, text)
        except KeyError:
            raise ModelUnavailable(
                f"the live embedding model {model!r} is not one this process knows"
            ) from None
        arguments = (model, vector, text, with_platform, own, limit, per_document)
        try:
            rows = await database.read(READ, organization_id, *arguments, *tuning.arguments())
        except asyncpg.PostgresError as error:
            if error.sqlstate == MODEL_MOVED:
                if models is not None:
                    models.invalidate(organization_id)
                raise ModelMoved(str(error)) from error
            raise
        rankings.append([Hit(**dict(row)) for row in rows])
    return merge(rankings, limit)


def merge(rankings: Sequence[Sequence[Hit]], limit: int) -> list[Hit]:
    """Rankings of separate scopes (under separate models) as one: by rank, the first
    ranking's hit first among equals, ``limit`` ranks in all (a rank is a document's, or a
    chunk's when results are chunks). One ranking is returned as it is."""
    if len(rankings) == 1:
        return list(rankings[0])
    ordered = sorted(
        (
            (hit.document_rank, which, position, hit)
            for which, ranking in enumerate(rankings)
            for position, hit in enumerate(ranking)
        ),
        key=lambda entry: entry[:3],
    )
    ranks: dict[tuple[int, int], int] = {}
    merged = []
    for rank, which, _, hit in ordered:
        key = (which, rank)
        if key not in ranks:
            if len(ranks) == limit:
                continue
            ranks[key] = len(ranks) + 1
        merged.append(replace(hit, document_rank=ranks[key]))
    return merged
