"""``CONTEXTCORE_UPLOAD_*``: the upload consumer's own settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from consumers.runtime.settings import ConsumerSettings
from contextcore.knowledge.addresses import bucket_name
from schemas.envelope import printable


class UploadSettings(ConsumerSettings):
    model_config = SettingsConfigDict(env_prefix="CONTEXTCORE_UPLOAD_", extra="ignore", frozen=True)

    group_id: str = "contextcore-upload"
    metrics_port: int = Field(default=9465, ge=0, le=65535)
    max_in_flight: int = Field(default=4, ge=1, le=1_000)
    """Extraction and chunking use a CPU each: keep this near the cores."""
    read_ahead: int = Field(default=10_000, ge=0, le=100_000)
    """Uploads waiting in their organization's lane: a bulk upload is thousands of records, and
    another tenant's upload behind them starts within a turn only once it is read."""
    read_ahead_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    """Inline documents are up to a record each: this bounds what the waiting ones hold."""
    nice: int = Field(default=10, ge=0, le=19)
    """Batch work: extraction yields the CPU to builds and memory writes on a shared node."""
    cpu_policy: Literal["normal", "idle"] = "idle"
    """And more: only the CPU time they leave (``SCHED_IDLE``; docs/operations.md)."""
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

    @field_validator("file_root")
    @classmethod
    def _existing_folder(cls, root: Path | None) -> Path | None:
        """An absolute path to a folder that exists: the consumer resolves it once, when it
        starts, and a relative one would be read from whatever folder the process started in.
        A root that is not there would refuse every ``file://`` upload, while the consumer says
        it is ready."""
        if root is None:
            return root
        shown = printable(str(root))[:200]
        if not root.is_absolute():
            raise ValueError(f"{shown} is not an absolute path")
        if not root.is_dir():
            raise ValueError(f"{shown} is not a folder")
        return root

    @field_validator("s3_endpoint_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        """``http://`` or ``https://``, a host and, if any, a port from 1 to 65535: the client
        library refuses anything else only at the first ``s3://`` upload, which then fails.
        The message never holds the URL: it may hold a credential."""
        if url is None:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http:// or https:// URL with a host")
        if any(character.isspace() for character in url):
            raise ValueError("a URL holds no whitespace")
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError("the port is not a number from 1 to 65535")
        return url

    @model_validator(mode="after")
    def _extraction_fits(self) -> Self:
        if self.extract_cpu_s > self.extract_wall_s:
            raise ValueError("extract_cpu_s must be at most extract_wall_s")
        if self.handle_timeout_s <= self.extract_wall_s:
            raise ValueError("handle_timeout_s must exceed extract_wall_s")
        return self
