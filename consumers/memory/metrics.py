"""The memory consumer's own series (no ids in labels)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class MemoryMetrics:
    writes: Counter
    changes: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> MemoryMetrics:
        return cls(
            writes=Counter(
                "contextcore_memory_writes_total",
                "Memory write calls answered, by operation, outcome (written, refused) and "
                "refusal reason (empty when written).",
                ["operation", "outcome", "reason"],
                registry=registry,
            ),
            changes=Counter(
                "contextcore_memory_revisions_total",
                "Revisions appended, by what they changed: created, superseded, revived, "
                "forgotten (a tombstone).",
                ["change"],
                registry=registry,
            ),
        )
