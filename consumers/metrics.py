"""Prometheus metrics of the consumers: one prefix, base units, ``_total`` counters.

Each app builds its own :class:`~prometheus_client.CollectorRegistry` (no global state, so tests
can build several apps in one process) and serves it on ``CONTEXTCORE_METRICS_PORT``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

# A bucket at each latency target: 15 ms (p99 of a whole build), 50 ms, and the 1 s source timeout.
_BUILD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class BuildMetrics:
    registry: CollectorRegistry
    requests: Counter
    duration: Histogram
    dead_letters: Counter
    publish_retries: Counter
    source_failures: Counter

    @classmethod
    def create(cls) -> BuildMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter(
                "contextcore_build_requests_total",
                "Build requests handled, by outcome (ok, error, dead_letter).",
                ["outcome"],
                registry=registry,
            ),
            duration=Histogram(
                "contextcore_build_duration_seconds",
                "Time from receiving a build request to its reply being acknowledged.",
                buckets=_BUILD_BUCKETS,
                registry=registry,
            ),
            dead_letters=Counter(
                "contextcore_dead_letters_total",
                "Records written to a dead-letter topic, by original topic.",
                ["topic"],
                registry=registry,
            ),
            publish_retries=Counter(
                "contextcore_reply_publish_retries_total",
                "Reply publishes that failed and left the request for redelivery.",
                registry=registry,
            ),
            source_failures=Counter(
                "contextcore_source_failures_total",
                "Context source reads that failed (raised, timed out, missing, or wrong items).",
                ["source", "required"],
                registry=registry,
            ),
        )


def count_source_failure(metrics: BuildMetrics) -> Callable[[str, str, bool], None]:
    """A builder ``on_source_failure`` hook that counts the failure (the builder logs it)."""

    def observe(name: str, reason: str, required: bool) -> None:
        metrics.source_failures.labels(source=name, required=str(required).lower()).inc()

    return observe


def serve_metrics(registry: CollectorRegistry, port: int) -> None:
    """Serve ``/metrics`` on ``port`` in a daemon thread; port 0 turns it off."""
    if port:
        start_http_server(port, addr="0.0.0.0", registry=registry)
