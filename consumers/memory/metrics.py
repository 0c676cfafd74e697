"""The memory consumer's own series (no ids in labels)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram

from schemas.memory import Change, RefusalReason


@dataclass(frozen=True)
class MemoryMetrics:
    writes: Counter
    changes: Counter
    chain_length: Histogram
    # the children counted so far, by metric and label values: ``labels()`` checks and
    # converts its values on every call, a cost per write
    _children: dict[tuple[str, ...], Counter] = field(default_factory=dict)

    def start_at_zero(self) -> None:
        """Create the series of the known labels now, at 0 (a counter that appears with its
        first increment shows Prometheus no increase)."""
        for operation in ("remember", "forget"):
            self._child(self.writes, "writes", operation, "written", "")
            self._child(self.writes, "writes", operation, "replayed", "")
            for reason in get_args(RefusalReason):
                self._child(self.writes, "writes", operation, "refused", reason)
        self._child(self.writes, "writes", "unknown", "refused", "invalid_input")  # undecodable
        for change in get_args(Change):
            self._child(self.changes, "changes", change)

    def count_write(self, operation: str, outcome: str, reason: str = "") -> None:
        self._child(self.writes, "writes", operation, outcome, reason).inc()

    def count_change(self, change: str, chain_length: int | None) -> None:
        self._child(self.changes, "changes", change).inc()
        if chain_length is not None:
            self.chain_length.observe(chain_length)

    def _child(self, metric: Counter, *key: str) -> Counter:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*key[1:])
        return child

    @classmethod
    def create(cls, registry: CollectorRegistry) -> MemoryMetrics:
        metrics = cls(
            writes=Counter(
                "contextcore_memory_writes_total",
                "Memory write calls answered, by operation, outcome (written: a revision "
                "appended; replayed: answered from the journal, nothing appended; refused) and "
                "refusal reason (empty unless refused).",
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
            chain_length=Histogram(
                "contextcore_memory_chain_length",
                "Revisions of the chain a write appended to, counting the new one (a tombstone "
                "counts): long chains are a fact rewritten again and again.",
                buckets=(1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144),
                registry=registry,
            ),
        )
        metrics.start_at_zero()
        return metrics
