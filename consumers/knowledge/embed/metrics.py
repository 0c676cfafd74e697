"""The embedding group's own series."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram


@dataclass(frozen=True)
class EmbedMetrics:
    chunks: Counter
    batch_seconds: Histogram
    batch_size: Histogram
    sources_ready: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EmbedMetrics:
        return cls(
            chunks=Counter(
                "contextcore_chunks_embedded_total",
                "Chunks embedded and stored (a redelivered chunk is not counted twice).",
                ["model"],
                registry=registry,
            ),
            batch_seconds=Histogram(
                "contextcore_embed_batch_seconds",
                "Time to encode and store one batch.",
                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
                registry=registry,
            ),
            batch_size=Histogram(
                "contextcore_embed_batch_chunks",
                "Chunks per embedding batch.",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                registry=registry,
            ),
            sources_ready=Counter(
                "contextcore_knowledge_sources_ready_total",
                "Sources that became ready under their live model.",
                registry=registry,
            ),
        )
