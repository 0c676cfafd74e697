"""``knowledge``: the knowledge base's chunks for the request's query, as context items.

The search itself is ``contextcore/knowledge/adapters/search.py``. ``include_organization`` and
``include_platform`` choose the scopes (both false by default: a policy opts in).
``spec.limit`` counts documents (CLARIFICATIONS 18; default 8, the Front Door's decision; 0
reads nothing); each brings its ``chunks_per_document`` best chunks. ``results: chunks`` makes
the limit count chunks instead. Each chunk is one item: title ``<section>`` (or the document's),
body the passage, ``ref`` the chunk (``knowledge_chunk``, citable, labelled with the document's
title), no subject key (a chunk's subject is too broad to name).

The order is the search's, and it is total (:mod:`contextcore.knowledge.adapters.search`):
documents by score, a tie by their first chunk's id, each document's chunks by score then id
(``results: chunks``: the chunks by score then id); the candidates ranked are the same for the
same rows (equal distances cut by chunk id, migration 00034). ``rank_in_section`` is that order.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contextcore.cache import TenantCache
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.search import LiveModels, ModelMoved, SearchTuning, search
from contextcore.storage.tenancy import TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef

DEFAULT_LIMIT = 8
TUNING = SearchTuning()


class KnowledgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_platform: bool = Field(default=False, strict=True)
    include_organization: bool = Field(default=False, strict=True)
    results: Literal["documents", "chunks"] = "documents"
    """What ``limit`` counts: documents (each with its best chunks) or chunks."""
    chunks_per_document: int = Field(default=1, ge=1, le=5, strict=True)


class KnowledgeContextSource:
    name = "knowledge"
    options_schema: type[BaseModel] = KnowledgeOptions

    def __init__(
        self,
        database: TenantDatabase,
        vectors: QueryVectors,
        models: TenantCache[LiveModels] | None = None,
        tuning: SearchTuning = TUNING,
    ) -> None:
        """``vectors`` embeds the query with the process's shared encoder of a model (loaded
        on first use); ``models`` caches each organization's live models (``None``: read them
        every time)."""
        self.database = database
        self.vectors = vectors
        self.models = models
        self.tuning = tuning

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        options = KnowledgeOptions.model_validate(spec.options)
        limit = DEFAULT_LIMIT if spec.limit is None else spec.limit
        if limit == 0 or not request.query.strip():
            return []
        if not (options.include_platform or options.include_organization):
            return []
        for attempt in (1, 2):
            try:
                hits = await search(
                    self.database,
                    request.subject.organization_id,
                    self.vectors,
                    request.query,
                    include_platform=options.include_platform,
                    include_organization=options.include_organization,
                    limit=limit,
                    per_document=(
                        options.chunks_per_document if options.results == "documents" else None
                    ),
                    tuning=self.tuning,
                    models=self.models,
                )
                break
            except ModelMoved:
                if attempt == 2:
                    raise
        return [
            ContextItem(
                source=self.name,
                kind="knowledge",
                title=hit.section or hit.title,
                body=hit.text,
                ref=ResourceRef(kind="knowledge_chunk", id=str(hit.chunk_id), label=hit.title),
                rank_in_section=rank,
            )
            for rank, hit in enumerate(hits)
        ]
