"""``CONTEXTCORE_MEMORY_*``: the memory consumer's own settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings


class MemorySettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_MEMORY_", extra="ignore", frozen=True)

    group_id: str = "contextcore-memory"
    metrics_port: int = Field(default=9468, ge=0, le=65535)
    max_in_flight: int = Field(default=64, ge=1, le=10_000)
    """Writes at once: each is one short transaction; the pool bounds the database side."""
