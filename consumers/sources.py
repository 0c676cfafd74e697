"""The context sources this process serves: one registry, shared by the build consumer and by
``contextcore policy check`` so that admission means the same thing in both.

No source is registered yet; the database-backed sources (application, dossier, definition
summaries, conversation, run history) arrive with the tenancy layer.
"""

from __future__ import annotations

from contextcore.registry import ContextSourceRegistry


def process_registry() -> ContextSourceRegistry:
    return ContextSourceRegistry([])
