"""The context sources this process serves: one registry, shared by the build consumer and by
``contextcore policy check``, so that admission means the same thing in both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contextcore.cache import TenantCache
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.search import KNOWLEDGE_MODELS_CHANNEL, LiveModels
from contextcore.knowledge.encoding import Encoder
from contextcore.memory.refs import DropReason
from contextcore.registry import ContextSourceRegistry
from contextcore.sources import definition_summary, dossier
from contextcore.sources.application import ApplicationContextSource
from contextcore.sources.conversation import ConversationContextSource
from contextcore.sources.definition_summary import DefinitionSummaryContextSource
from contextcore.sources.dossier import DossierContextSource, Fact
from contextcore.sources.knowledge import KnowledgeContextSource
from contextcore.sources.memory import MemoryContextSource
from contextcore.sources.run_history import RunHistoryContextSource
from contextcore.storage.tenancy import TenantDatabase
from schemas.errors import InfrastructureUnavailable


@dataclass(frozen=True)
class SourceCaches:
    """The process's caches of slowly changing source data, each with the channel that
    invalidates it (:class:`~contextcore.storage.invalidation.CacheInvalidator`)."""

    dossier: TenantCache[list[Fact]] = field(default_factory=lambda: TenantCache("dossier"))
    definitions: TenantCache[list[definition_summary.Row]] = field(
        default_factory=lambda: TenantCache("definition_summary")
    )
    knowledge_models: TenantCache[LiveModels] = field(
        default_factory=lambda: TenantCache("knowledge_models")
    )

    def by_channel(self) -> dict[str, TenantCache[Any]]:
        return {
            dossier.CHANNEL: self.dossier,
            definition_summary.CHANNEL: self.definitions,
            KNOWLEDGE_MODELS_CHANNEL: self.knowledge_models,
        }


async def _no_encoder(model: str) -> Encoder:
    raise InfrastructureUnavailable(f"this process has no embedding model ({model})")


def process_registry(
    database: TenantDatabase | None = None,
    caches: SourceCaches | None = None,
    *,
    vectors: QueryVectors | None = None,
    on_memory_drop: Callable[[DropReason], None] | None = None,
) -> ContextSourceRegistry:
    """The seven database sources; without a database (or, for knowledge, the query vectors of
    an encoder) they can be admitted but not read."""
    database = database or TenantDatabase(None)
    caches = caches or SourceCaches()  # never listening without an invalidator: no caching
    return ContextSourceRegistry(
        [
            ConversationContextSource(database),
            ApplicationContextSource(database),
            DossierContextSource(database, caches.dossier),
            DefinitionSummaryContextSource(database, caches.definitions),
            RunHistoryContextSource(database),
            KnowledgeContextSource(
                database,
                vectors if vectors is not None else QueryVectors(_no_encoder),
                caches.knowledge_models,
            ),
            MemoryContextSource(database, on_drop=on_memory_drop),
        ]
    )
