"""The build consumer's own series, beside the runtime's, in the same registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class BuildMetrics:
    requests: Counter
    source_failures: Counter
    memories_dropped: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BuildMetrics:
        return cls(
            requests=Counter(
                "contextcore_build_requests_total",
                "Build requests answered, by outcome (ok, error, reuse_previous, dead_letter).",
                ["outcome"],
                registry=registry,
            ),
            source_failures=Counter(
                "contextcore_source_failures_total",
                "Context source reads that failed (raised, timed out, missing, or wrong items).",
                ["source", "required"],
                registry=registry,
            ),
            memories_dropped=Counter(
                "contextcore_memories_dropped_total",
                "Memories the memory source read but kept out of the brief, by reason: "
                "malformed_ref, unknown_kind, unresolved_ref (the tenant guard).",
                ["reason"],
                registry=registry,
            ),
        )

    def memory_drop_hook(self) -> Callable[[str], None]:
        """A memory source ``on_drop`` hook that counts the drop (the source logs it)."""

        def observe(reason: str) -> None:
            self.memories_dropped.labels(reason=reason).inc()

        return observe

    def source_failure_hook(self) -> Callable[[str, str, bool], None]:
        """A builder ``on_source_failure`` hook that counts the failure (the builder logs it)."""

        def observe(name: str, reason: str, required: bool) -> None:
            self.source_failures.labels(source=name, required=str(required).lower()).inc()

        return observe
