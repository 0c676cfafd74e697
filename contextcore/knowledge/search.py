"""``knowledge``: hybrid search over ready knowledge chunks, as context items.

One read: ``knowledge_search`` (migration 00007), SECURITY INVOKER, in the subject's
organization scope, which filters the organization explicitly, reads ready sources only and
chunks of the scope's live model only, and fuses the full-text rank of ``request.query`` with
the vector ranking. ``include_organization`` and ``include_platform`` choose the scopes (both
false by default: a policy opts in). The query is embedded with the live model by the process's
one shared encoder; a live model this process cannot encode fails the source (never a query
embedded by another model: its vectors are not comparable).

Each chunk is one item: title ``<document> > <section>``, body the passage, ``ref`` the chunk
(``knowledge_chunk``, citable), no subject key (a chunk's subject is too broad to name).
``spec.limit`` caps the chunks (default 8, the Front Door's decision; 0 reads nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from contextcore.knowledge.encoder import Encoder
from contextcore.knowledge.store import vector_text
from contextcore.models import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef
from contextcore.storage.tenancy import TenantConnection, TenantDatabase, TenantQuery

DEFAULT_LIMIT = 8
MAX_QUERY_CHARS = 2_000


class KnowledgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_platform: bool = Field(default=False, strict=True)
    include_organization: bool = Field(default=False, strict=True)


@dataclass(frozen=True)
class SearchTuning:
    """The fusion's constants (``bench/quality.py`` chose them; docs/knowledge.md)."""

    candidates: int = 40
    lexical_weight: float = 0.2
    ef_search: int = 200


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


ACTIVE_MODEL = TenantQuery(
    "knowledge.active_model",
    """
-- knowledge.active_model: the model the scope's searches embed with.
SELECT knowledge_active_model($1)
""",
)

SEARCH = TenantQuery(
    "knowledge.search",
    """
-- knowledge.search: hybrid search of this organization and/or the platform (migration 00007).
SELECT chunk_id, source_id, organization_id, title, section, ordinal, text, tokens,
       embedding_model, similarity, lexical, score
FROM knowledge_search($1, $2::vector, $3, $4, $5, $6, $7, $8, $9)
""",
)


class ModelUnavailable(LookupError):
    """The scope's live model is not the one this process encodes with."""


async def active_model(tenant: TenantConnection) -> str:
    model: str = await tenant.fetchval(ACTIVE_MODEL)
    return model


async def search(
    tenant: TenantConnection,
    encoder: Encoder,
    query: str,
    *,
    include_platform: bool,
    include_organization: bool,
    limit: int,
    tuning: SearchTuning = SearchTuning(),
) -> list[Hit]:
    """The best ``limit`` chunks for ``query`` in the scope of ``tenant``; ``encoder`` must be
    the scope's live model's (:func:`active_model`), or the vectors would not be comparable.

    Raises:
        ModelUnavailable: the scope's live model is not ``encoder.model``.
    """
    model = await active_model(tenant)
    if model != encoder.model:
        raise ModelUnavailable(
            f"the live embedding model is {model!r}; the query was embedded by {encoder.model!r}"
        )
    text = query[:MAX_QUERY_CHARS]
    [vector] = await asyncio.to_thread(encoder.encode, [text])
    rows = await tenant.fetch(
        SEARCH,
        vector_text(vector),
        text,
        include_platform,
        include_organization,
        limit,
        tuning.candidates,
        tuning.lexical_weight,
        tuning.ef_search,
    )
    return [Hit(**dict(row)) for row in rows]


class KnowledgeContextSource:
    name = "knowledge"
    options_schema: type[BaseModel] = KnowledgeOptions

    def __init__(
        self,
        database: TenantDatabase,
        encoders: Callable[[str], Awaitable[Encoder]],
        tuning: SearchTuning = SearchTuning(),
    ) -> None:
        """``encoders`` gives the process's shared encoder of a model (loaded on first use)
        and raises ``KeyError`` for a model the process does not know."""
        self.database = database
        self.encoders = encoders
        self.tuning = tuning

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        options = KnowledgeOptions.model_validate(spec.options)
        limit = DEFAULT_LIMIT if spec.limit is None else spec.limit
        if limit == 0 or not request.query.strip():
            return []
        if not (options.include_platform or options.include_organization):
            return []
        async with self.database.scoped(request.subject.organization_id) as tenant:
            model = await active_model(tenant)
            try:
                encoder = await self.encoders(model)
            except KeyError:
                raise ModelUnavailable(
                    f"the live embedding model {model!r} is not one this process knows"
                ) from None
            hits = await search(
                tenant,
                encoder,
                request.query,
                include_platform=options.include_platform,
                include_organization=options.include_organization,
                limit=limit,
                tuning=self.tuning,
            )
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
