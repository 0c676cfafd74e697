"""The build consumer's own series, beside the runtime's, in the same registry (no ids in
labels: a source is a registered source name, a bounded set)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from consumers.runtime.metrics import STAGE_BUCKETS
from contextcore.builder import ReadCause
from contextcore.packer import DROP_REASONS, OVER_TOTAL
from contextcore.storage.tenancy import TenantDatabase
from schemas.context import ContextBrief

# Tokens of one brief: policies budget from a few hundred to a few thousand tokens.
TOKEN_BUCKETS = (0, 50, 100, 250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000)


class RoundTrips(Collector):
    """``contextcore_database_round_trips_total``: what the sources sent PostgreSQL, read from
    the tenancy layer's count at each scrape (nothing on the build path but an addition)."""

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(
            "contextcore_database_round_trips",
            "Statements, scope entries and commits the context sources sent PostgreSQL, each "
            "one round trip (divide by contextcore_build_requests_total).",
            value=self.database.round_trips,
        )


class CacheCounts(Protocol):
    """What a cache tells /metrics: the per-organization source caches, the query vectors."""

    name: str
    hits: int
    misses: int

    def __len__(self) -> int: ...


class CacheStatistics(Collector):
    """``contextcore_source_cache_requests_total{cache, outcome}`` (hit or miss) and
    ``contextcore_source_cache_entries{cache}``, read from the caches at each scrape."""

    def __init__(self, caches: Iterable[CacheCounts]) -> None:
        self.caches = list(caches)

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        requests = CounterMetricFamily(
            "contextcore_source_cache_requests",
            "Reads of a per-organization source cache, by cache and outcome (hit, miss; a "
            "miss reads the database).",
            labels=["cache", "outcome"],
        )
        entries = GaugeMetricFamily(
            "contextcore_source_cache_entries",
            "Entries held by each per-organization source cache (bounded).",
            labels=["cache"],
        )
        for cache in self.caches:
            requests.add_metric([cache.name, "hit"], cache.hits)
            requests.add_metric([cache.name, "miss"], cache.misses)
            entries.add_metric([cache.name], len(cache))
        yield requests
        yield entries


@dataclass(frozen=True)
class BuildMetrics:
    requests: Counter
    throttled: Counter
    source_seconds: Histogram
    source_failures: Counter
    brief_tokens: Histogram
    source_tokens: Counter
    dropped_items: Counter
    briefs_at_total: Counter
    memories_dropped: Counter
    read_after: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> BuildMetrics:
        return cls(
            requests=Counter(
                "contextcore_build_requests_total",
                "Build requests answered, by outcome (ok, error, reuse_previous, dead_letter).",
                ["outcome"],
                registry=registry,
            ),
            source_seconds=Histogram(
                "contextcore_source_read_seconds",
                "Time of one context source read in a build, by source (a read that timed out "
                "counts its timeout).",
                ["source"],
                buckets=STAGE_BUCKETS,
                registry=registry,
            ),
            throttled=Counter(
                "contextcore_build_throttled_total",
                "Build requests answered throttled (over the organization's rate), by "
                "organization: the first 50 organizations a process throttles by id, the rest "
                "as 'other' (a bounded number of series).",
                ["organization"],
                registry=registry,
            ),
            source_failures=Counter(
                "contextcore_source_failures_total",
                "Context source reads that failed, by source, cause (timeout, error, missing, "
                "wrong_source) and whether the policy required the source.",
                ["source", "cause", "required"],
                registry=registry,
            ),
            brief_tokens=Histogram(
                "contextcore_brief_tokens",
                "Tokens of each brief built (the notice of unavailable sources included).",
                buckets=TOKEN_BUCKETS,
                registry=registry,
            ),
            source_tokens=Counter(
                "contextcore_source_tokens_total",
                "Tokens the briefs spent on each source's items.",
                ["source"],
                registry=registry,
            ),
            dropped_items=Counter(
                "contextcore_items_dropped_total",
                "Items a source returned that the packer left out of the brief, by source and "
                "reason (not_enabled, outranked, over_source_budget, over_total_budget).",
                ["source", "reason"],
                registry=registry,
            ),
            briefs_at_total=Counter(
                "contextcore_briefs_at_total_budget_total",
                "Briefs that left at least one item out because the total budget was full "
                "(their share of the ok builds: how often policies run out of total).",
                registry=registry,
            ),
            memories_dropped=Counter(
                "contextcore_memories_dropped_total",
                "Memories the memory source read but kept out of the brief, by reason: "
                "malformed_ref, unknown_kind, unresolved_ref (the tenant guard).",
                ["reason"],
                registry=registry,
            ),
            read_after=Counter(
                "contextcore_build_read_after_total",
                "Build requests that named a position to read after (read-your-writes), by the "
                "database their sources read: replica (it had replayed that far), primary (it "
                "had not, or sources read the primary anyway), or ignored (a position the "
                "primary never wrote: read as none).",
                ["database"],
                registry=registry,
            ),
        )

    def start_at_zero(self, sources: Iterable[str]) -> None:
        """Create the series of the known labels now, at 0: a counter that appears with its
        first increment shows Prometheus no increase (and a dashboard no line)."""
        for outcome in ("ok", "error", "reuse_previous", "dead_letter"):
            self.requests.labels(outcome)
        self.throttled.labels("other")
        for source in sources:
            for cause in (c for c in get_args(ReadCause) if c != "ok"):
                for required in ("true", "false"):
                    self.source_failures.labels(source, cause, required)
            for reason in DROP_REASONS:
                self.dropped_items.labels(source, reason)
        for reason in ("malformed_ref", "unknown_kind", "unresolved_ref"):
            self.memories_dropped.labels(reason)
        for database in ("replica", "primary", "ignored"):
            self.read_after.labels(database)

    def memory_drop_hook(self) -> Callable[[str], None]:
        """A memory source ``on_drop`` hook that counts the drop (the source logs it)."""

        def observe(reason: str) -> None:
            self.memories_dropped.labels(reason=reason).inc()

        return observe

    # ------------------------------------------------------------------ BuildObserver

    def source_read(self, source: str, seconds: float, cause: ReadCause, required: bool) -> None:
        self.source_seconds.labels(source).observe(seconds)
        if cause != "ok":
            self.source_failures.labels(source, cause, "true" if required else "false").inc()

    def items_dropped(self, drops: Mapping[tuple[str, str], int]) -> None:
        """One brief's drops (the builder calls this at most once per brief)."""
        for (source, reason), count in drops.items():
            self.dropped_items.labels(source, reason).inc(count)
        if any(reason == OVER_TOTAL for _, reason in drops):
            self.briefs_at_total.inc()

    def brief(self, brief: ContextBrief) -> None:
        """What one brief spent."""
        self.brief_tokens.observe(brief.tokens)
        for source, tokens in brief.per_source_tokens.items():
            if tokens:
                self.source_tokens.labels(source).inc(tokens)
