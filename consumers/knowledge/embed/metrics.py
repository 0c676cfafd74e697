"""The embedding group's own series, and the encoder that feeds two of them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from contextcore.knowledge.encoding import Encoder

ENCODE_BUCKETS = (
    *(0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4),
    *(0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5),
    *(1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 10.0, 30.0),
)
"""Fine from 0.1 to 1.5 s, where one encode of a busy node lies: an upload's wait beside a flood
is read from them (bench/fairness.py)."""


@dataclass(frozen=True)
class EmbedMetrics:
    chunks: Counter
    batch_seconds: Histogram
    batch_size: Histogram
    encode_seconds: Histogram
    encode_texts: Histogram
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
            encode_seconds=Histogram(
                "contextcore_embed_encode_seconds",
                "Time of one model call: the merged encode of the batches waiting (what a "
                "batch that arrives meanwhile waits for, at most, before its own).",
                ["model"],
                buckets=ENCODE_BUCKETS,
                registry=registry,
            ),
            encode_texts=Histogram(
                "contextcore_embed_encode_texts",
                "Passages per model call (several batches' merged).",
                ["model"],
                buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                registry=registry,
            ),
            sources_ready=Counter(
                "contextcore_knowledge_sources_ready_total",
                "Sources that became ready under their live model.",
                registry=registry,
            ),
        )


class TimedEncoder:
    """``encoder``, each call observed: its seconds and its passages, under its model."""

    def __init__(self, encoder: Encoder, metrics: EmbedMetrics) -> None:
        self._encoder = encoder
        self.model = encoder.model
        self.dimensions = encoder.dimensions
        self._seconds = metrics.encode_seconds.labels(encoder.model)
        self._texts = metrics.encode_texts.labels(encoder.model)

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        started = time.perf_counter()
        try:
            return self._encoder.encode(texts)
        finally:  # thread-safe: the encoder runs in a worker thread
            self._seconds.observe(time.perf_counter() - started)
            self._texts.observe(len(texts))
