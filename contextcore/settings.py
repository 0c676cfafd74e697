"""Settings read from the environment, every name prefixed ``CONTEXTCORE_``.

Nothing here falls back silently: a runtime that needs the database or the broker asks for it
through :meth:`Settings.require_database_url` / :meth:`Settings.require_bootstrap_servers`, which
raise a one-line :class:`~contextcore.errors.ConfigurationError` when the setting is absent.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contextcore.errors import ConfigurationError


class Settings(BaseSettings):
    """Every knob of the service, one environment variable each (``CONTEXTCORE_<NAME>``)."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_", extra="ignore", frozen=True)

    database_url: str | None = None
    """PostgreSQL + pgvector; required by every runtime, schema and admin command."""
    database_read_url: str | None = None
    """Optional read replica; the build consumer reads sources through it when set."""
    database_connect_timeout_s: float = Field(default=5.0, gt=0)
    database_role: str = "contextcore_app"
    """The role every tenant read runs as (``SET LOCAL ROLE``): it owns no table, so row-level
    security applies. The login role of the URL must be a member of it."""
    database_pool_size: int = Field(default=10, ge=1)
    source_timeout_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """The builder's independent timeout per source read: an outage ceiling, not a target."""

    kafka_bootstrap_servers: str | None = None
    """Comma-separated ``host:port`` list of the Kafka-protocol broker."""
    kafka_fetch_max_wait_ms: int = Field(default=20, ge=0, le=10_000)
    """Bounds the broker's long poll, and so the request/reply latency (500 ms → ~255 ms/hop)."""
    kafka_connect_timeout_s: float = Field(default=10.0, gt=0)

    topic_build_request: str = "contextcore.build-request"
    topic_build_request_partitions: int = Field(default=4, ge=1)
    build_group_id: str = "contextcore-build"
    reply_topic_prefix: str = "contextcore.reply"
    """Clients create an ephemeral reply topic ``<prefix>.<client id>`` and delete it on close."""

    metrics_port: int = Field(default=9464, ge=0, le=65535)
    """Port of the ``/metrics`` endpoint of a consumer; 0 turns it off."""

    def environ(self) -> dict[str, str]:
        """These settings as the ``CONTEXTCORE_*`` variables that configure a child process."""
        return {
            f"CONTEXTCORE_{name.upper()}": str(value)
            for name, value in self.model_dump().items()
            if value is not None
        }

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                "CONTEXTCORE_DATABASE_URL is not set: point it at a PostgreSQL + pgvector "
                "database (or run `contextcore dev up` and use the URL it prints)"
            )
        return self.database_url

    def require_bootstrap_servers(self) -> str:
        if not self.kafka_bootstrap_servers:
            raise ConfigurationError(
                "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS is not set: point it at a Kafka broker "
                "(or run `contextcore dev up` and use the address it prints)"
            )
        return self.kafka_bootstrap_servers


def dead_letter_topic(topic: str) -> str:
    """The dead-letter topic of ``topic``: records that could not be answered go there."""
    return f"{topic}.dlt"
