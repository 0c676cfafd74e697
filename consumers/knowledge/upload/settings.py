"""``CONTEXTCORE_UPLOAD_*``: the upload consumer's own settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings
from contextcore.knowledge.addresses import bucket_name


class UploadSettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_UPLOAD_", extra="ignore", frozen=True)

    group_id: str = "contextcore-upload"
    metrics_port: int = Field(default=9465, ge=0, le=65535)
    max_in_flight: int = Field(default=4, ge=1, le=1_000)
    """Extraction and chunking use a CPU each: keep this near the cores."""
    handle_timeout_s: float = Field(default=300.0, gt=0)
    """Covers a wait for a free extraction worker and a job of its own, each up to
    ``extract_wall_s``, and the reads and writes around them."""
    stuck_after_s: float = Field(default=360.0, gt=0)
    max_document_bytes: int = Field(default=20_000_000, ge=1)
    max_document_chars: int = Field(default=2_000_000, ge=1)
    max_pdf_pages: int = Field(default=2_000, ge=1)
    max_document_chunks: int = Field(default=10_000, ge=1, le=1_000_000)
    """Chunks one document may make under one model (contextcore/knowledge/extract.py)."""
    extract_workers: int = Field(default=2, ge=1, le=64)
    """Worker processes that extract and chunk (one CPU each while they work)."""
    extract_memory_mb: int = Field(default=512, ge=128, le=65_536)
    """A worker's address space: a document that needs more fails with that reason."""
    extract_cpu_s: float = Field(default=60.0, gt=0, le=3_600)
    """CPU time one document may take."""
    extract_wall_s: float = Field(default=90.0, gt=0, le=3_600)
    """Wall time one document may take (at least ``extract_cpu_s``)."""
    extract_output_mb: int = Field(default=64, ge=1, le=1_024)
    """The largest answer a worker may send back (the text and its chunks)."""
    embed_batch_chunks: int = Field(default=32, ge=1, le=512)
    """Chunks per embedding batch (one record of the embedding topic)."""
    file_root: Path | None = None
    """``file://`` uploads are read under this folder only; unset, they are refused."""
    s3_buckets: Annotated[tuple[str, ...], NoDecode] = ()
    """The buckets an ``s3://`` upload may name (comma-separated); empty: none. The endpoint
    below is the only host a read goes to: an address never names one."""
    s3_endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, a local server); unset, AWS's."""
    s3_region: str | None = None
    s3_tenant_prefixes: bool = True
    """An S3 key must start with ``<organization id>/`` (``platform/`` for the platform)."""
    fetch_max_wait_ms: int | None = Field(default=100, ge=0, le=10_000)
    """Uploads are not latency-bound; see the embedding group's."""

    @field_validator("s3_buckets", mode="before")
    @classmethod
    def _bucket_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # "a,b", or a JSON list
            if value.lstrip().startswith("["):
                return json.loads(value)
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @field_validator("s3_buckets")
    @classmethod
    def _plain_buckets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(bucket_name(name) for name in value)

    @model_validator(mode="after")
    def _extraction_fits(self) -> Self:
        if self.extract_cpu_s > self.extract_wall_s:
            raise ValueError("extract_cpu_s must be at most extract_wall_s")
        if self.handle_timeout_s <= self.extract_wall_s:
            raise ValueError("handle_timeout_s must exceed extract_wall_s")
        return self
