"""``CONTEXTCORE_BUILD_*``: the build consumer's own settings."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings


class BuildSettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_BUILD_", extra="ignore", frozen=True)

    group_id: str = "contextcore-build"
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    max_in_flight: int = Field(default=16, ge=1, le=10_000)
    """Builds at once; each reads up to five sources, so keep it near the database pool."""
    quotas_ttl_s: float = Field(default=5.0, gt=0, le=3_600, allow_inf_nan=False)
    """How long this process keeps an organization's quotas (build_rate, build_burst:
    contextcore/quotas.py) before reading them again: a changed quota applies within it."""
    replica_lag_interval_s: float = Field(default=5.0, gt=0, le=3_600, allow_inf_nan=False)
    """How often the database the sources read is asked how far behind its primary it is
    (``contextcore_database_replica_lag_seconds``)."""
    source_timeout_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """The builder's independent timeout per source read: an outage ceiling, not a target."""
    preload_encoder: bool = True
    """Load the query encoder of every model this process knows, and run its first inference,
    before the consumer says it is ready (the light OpenVINO one: about 190 MB, a few seconds;
    the first load may export the model). Off, it loads at the first build whose policy reads
    knowledge, and that build's knowledge source times out while it loads."""
