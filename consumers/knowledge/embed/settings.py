"""``CONTEXTCORE_EMBED_*``: the embedding group's own settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings


class EmbedSettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_EMBED_", extra="ignore", frozen=True)

    group_id: str = "contextcore-embed"
    metrics_port: int = Field(default=9466, ge=0, le=65535)
    max_in_flight: int = Field(default=16, ge=1, le=64)
    """Batches at once: the ones waiting while an encode runs are merged into the next encode
    (up to 64 chunks), and a batch's database write overlaps the next encode. 16, not 4: a
    document of one passage is a batch of one or two chunks, and four of them made encodes too
    small (bench.ingest --small 2000: 0.45 of the raw encode at 4, 0.58 at 16, 0.57 at 64;
    60 large documents: 0.72 at 4, 0.77 at 16; docs/performance.md)."""
    read_ahead: int = Field(default=10_000, ge=0, le=100_000)
    """Batches waiting in their organization's lane: an upload of thousands of documents is
    thousands of batches, and another tenant's batch behind them is started within a turn only
    once it is read."""
    read_ahead_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    nice: int = Field(default=10, ge=0, le=19)
    """Batch work: the encoder yields the CPU to builds and memory writes on a shared node."""
    cpu_policy: Literal["normal", "idle"] = "idle"
    """And more: only the CPU time they leave (``SCHED_IDLE``; docs/operations.md)."""
    handle_timeout_s: float = Field(default=120.0, gt=0)
    stuck_after_s: float = Field(default=300.0, gt=0)
    fetch_max_wait_ms: int | None = Field(default=100, ge=0, le=10_000)
    """Batches are throughput, not latency: polling Tansu every 2 ms took a third of the
    encoder's CPU on two cores (bench/ingest.py)."""
