"""``CONTEXTCORE_UPLOAD_*``: the upload consumer's own settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings


class UploadSettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_UPLOAD_", extra="ignore", frozen=True)

    group_id: str = "contextcore-upload"
    metrics_port: int = Field(default=9465, ge=0, le=65535)
    max_in_flight: int = Field(default=4, ge=1, le=1_000)
    """Extraction and chunking use a CPU each: keep this near the cores."""
    handle_timeout_s: float = Field(default=120.0, gt=0)
    stuck_after_s: float = Field(default=300.0, gt=0)
    max_document_bytes: int = Field(default=20_000_000, ge=1)
    max_document_chars: int = Field(default=2_000_000, ge=1)
    max_pdf_pages: int = Field(default=2_000, ge=1)
    embed_batch_chunks: int = Field(default=32, ge=1, le=512)
    """Chunks per embedding batch (one record of the embedding topic)."""
    file_root: Path | None = None
    """``file://`` uploads are read under this folder only; unset, they are refused."""
    s3_endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, a local server); unset, AWS's."""
    s3_region: str | None = None
    s3_tenant_prefixes: bool = True
    """An S3 key must start with ``<organization id>/`` (``platform/`` for the platform)."""
    fetch_max_wait_ms: int | None = Field(default=100, ge=0, le=10_000)
    """Uploads are not latency-bound; see the embedding group's."""
