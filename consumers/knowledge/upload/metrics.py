"""The upload consumer's own series."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from prometheus_client import CollectorRegistry, Counter

from schemas.upload import UploadStatus


@dataclass(frozen=True)
class UploadMetrics:
    uploads: Counter
    batches_published: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> UploadMetrics:
        metrics = cls(
            uploads=Counter(
                "contextcore_uploads_total",
                "Uploads answered, by the source's status (pending, ready, failed), rejected, "
                "or superseded (a later upload of the same document had replaced it).",
                ["outcome"],
                registry=registry,
            ),
            batches_published=Counter(
                "contextcore_embed_batches_published_total",
                "Embedding batches the upload consumer published.",
                registry=registry,
            ),
        )
        for outcome in get_args(UploadStatus):  # every status an upload is answered, at 0
            metrics.uploads.labels(outcome)
        return metrics
