"""``CONTEXTCORE_MEMORY_*``: the memory consumer's own settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings


class MemorySettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_MEMORY_", extra="ignore", frozen=True)

    group_id: str = "contextcore-memory"
    metrics_port: int = Field(default=9468, ge=0, le=65535)
    max_in_flight: int = Field(default=256, ge=1, le=10_000)
    """Writes at once. They go to the database in batches of up to 64, two batches at a time
    (``MemoryService``): more writes waiting make fuller batches, and a write in a batch costs
    the database about half of one alone (docs/performance.md)."""
