"""The upload consumer's own series."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class UploadMetrics:
    uploads: Counter
    batches_published: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> UploadMetrics:
        metrics = cls(
            uploads=Counter(
                "contextcore_uploads_total",
                "Uploads answered, by the source's status (pending, ready, failed) or rejected.",
                ["outcome"],
                registry=registry,
            ),
            batches_published=Counter(
                "contextcore_embed_batches_published_total",
                "Embedding batches the upload consumer published.",
                registry=registry,
            ),
        )
        for outcome in ("pending", "ready", "failed", "rejected"):  # at 0 from the start
            metrics.uploads.labels(outcome)
        return metrics
