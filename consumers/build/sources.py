"""The context sources this process serves: one registry, shared by the build consumer and by
``contextcore policy check``, so that admission means the same thing in both."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from contextcore.errors import InfrastructureUnavailable
from contextcore.knowledge.encoder import Encoder
from contextcore.knowledge.search import KnowledgeContextSource
from contextcore.registry import ContextSourceRegistry
from contextcore.sources.application import ApplicationContextSource
from contextcore.sources.conversation import ConversationContextSource
from contextcore.sources.definition_summary import DefinitionSummaryContextSource
from contextcore.sources.dossier import DossierContextSource, Fact
from contextcore.sources.dossier_cache import DossierCache
from contextcore.sources.memory import DropReason, MemoryContextSource
from contextcore.sources.run_history import RunHistoryContextSource
from contextcore.storage.tenancy import TenantDatabase


async def _no_encoder(model: str) -> Encoder:
    raise InfrastructureUnavailable(f"this process has no embedding model ({model})")


def process_registry(
    database: TenantDatabase | None = None,
    dossier_cache: DossierCache[list[Fact]] | None = None,
    *,
    encoders: Callable[[str], Awaitable[Encoder]] | None = None,
    on_memory_drop: Callable[[DropReason], None] | None = None,
) -> ContextSourceRegistry:
    """The seven database sources; without a database (or, for knowledge, an encoder) they can
    be admitted but not read."""
    database = database or TenantDatabase(None)
    return ContextSourceRegistry(
        [
            ConversationContextSource(database),
            ApplicationContextSource(database),
            DossierContextSource(database, dossier_cache or DossierCache()),
            DefinitionSummaryContextSource(database),
            RunHistoryContextSource(database),
            KnowledgeContextSource(database, encoders or _no_encoder),
            MemoryContextSource(database, on_drop=on_memory_drop),
        ]
    )
