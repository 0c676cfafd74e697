"""The runtime's Prometheus series: one prefix, base units, ``_total`` counters, no ids in labels.

Every consumer process builds its own :class:`~prometheus_client.CollectorRegistry` (no global
state: tests build several in one process). Labels name the consumer, a stage, an outcome, a
cause or a partition number; never a correlation id, an organization or a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contextcore.storage.migrations import load_migrations

# Stage latencies: a bucket at each target (a 15 ms build, a 50 ms p99), at the 1 s source
# timeout, and up to the 10 s publish timeout.
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@dataclass(frozen=True)
class RuntimeMetrics:
    registry: CollectorRegistry
    records: Counter
    stage_seconds: Histogram
    record_seconds: Histogram
    dead_letters: Counter
    retries: Counter
    publish_failures: Counter
    commits: Counter
    in_flight: Gauge
    waiting: Gauge
    waits: Counter
    alone: Counter
    schema: Info

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> RuntimeMetrics:
        registry = registry or CollectorRegistry()
        schema = schema_info(registry)
        return cls(
            registry=registry,
            records=Counter(
                "contextcore_consumer_records_total",
                "Records settled, by consumer and outcome (reply, done, dead_letter, retry).",
                ["consumer", "outcome"],
                registry=registry,
            ),
            stage_seconds=Histogram(
                "contextcore_consumer_stage_seconds",
                "Time spent per record in each stage (decode, build, serialise, publish), and "
                "per commit request (commit).",
                ["consumer", "stage"],
                buckets=STAGE_BUCKETS,
                registry=registry,
            ),
            record_seconds=Histogram(
                "contextcore_consumer_record_seconds",
                "Time from a record's start to its outcome being published.",
                ["consumer"],
                buckets=STAGE_BUCKETS,
                registry=registry,
            ),
            dead_letters=Counter(
                "contextcore_dead_letters_total",
                "Records written to a dead-letter topic, by original topic and cause.",
                ["topic", "cause"],
                registry=registry,
            ),
            retries=Counter(
                "contextcore_consumer_retries_total",
                "Records re-published for a later attempt, by consumer and cause.",
                ["consumer", "cause"],
                registry=registry,
            ),
            publish_failures=Counter(
                "contextcore_consumer_publish_failures_total",
                "Publishes the broker refused, by consumer and what was published "
                "(reply, retry, dead_letter).",
                ["consumer", "kind"],
                registry=registry,
            ),
            commits=Counter(
                "contextcore_consumer_commits_total",
                "Offset commit requests, by consumer and result (ok, failed).",
                ["consumer", "result"],
                registry=registry,
            ),
            in_flight=Gauge(
                "contextcore_consumer_in_flight",
                "Records started and not yet settled.",
                ["consumer"],
                registry=registry,
            ),
            waiting=Gauge(
                "contextcore_consumer_waiting",
                "Records received and not started yet: they wait in their organization's lane "
                "for a slot (at most the consumer's read-ahead).",
                ["consumer"],
                registry=registry,
            ),
            waits=Counter(
                "contextcore_consumer_waits_total",
                "Handlings of a record tried again in place, no attempt spent, because a "
                "dependency did not answer, by consumer and cause (database).",
                ["consumer", "cause"],
                registry=registry,
            ),
            alone=Counter(
                "contextcore_consumer_records_run_alone_total",
                "Records started before without an outcome (they may have killed their "
                "process), run with nothing else in flight.",
                ["consumer"],
                registry=registry,
            ),
            schema=schema,
        )


class Stages:
    """One consumer's ``contextcore_consumer_stage_seconds`` children, each bound on its first
    use: ``labels()`` checks and converts its values on every call, a cost per record."""

    def __init__(self, metrics: RuntimeMetrics, consumer: str) -> None:
        self._histogram = metrics.stage_seconds
        self._consumer = consumer
        self._children: dict[str, Histogram] = {}

    def __call__(self, stage: str) -> Histogram:
        child = self._children.get(stage)
        if child is None:
            child = self._children[stage] = self._histogram.labels(self._consumer, stage)
        return child


def schema_info(registry: CollectorRegistry) -> Info:
    """``contextcore_schema_info{migration,version} 1``: the database schema this process runs
    against, its newest migration (a process starts only when the database has applied exactly
    the migrations it knows)."""
    schema = Info(
        "contextcore_schema",
        "The database schema this process runs against: its newest migration.",
        registry=registry,
    )
    latest = load_migrations()[-1]
    schema.info({"migration": latest.label, "version": str(latest.version)})
    return schema


class PartitionGauge(Collector):
    """One gauge per owned partition, labelled ``labels`` then ``topic`` and ``partition``,
    read at scrape time from a snapshot the event loop refreshes (the scrape runs in another
    thread and must not walk live structures)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: dict[str, str],
        snapshot: Callable[[], Mapping[tuple[str, int], float]],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            self.name, self.documentation, labels=[*self.labels, "topic", "partition"]
        )
        for (topic, partition), value in sorted(self.snapshot().items()):
            family.add_metric([*self.labels.values(), topic, str(partition)], value)
        yield family


def oldest_in_flight(
    consumer: str, snapshot: Callable[[], Mapping[tuple[str, int], float]]
) -> PartitionGauge:
    """``contextcore_consumer_oldest_in_flight_age_seconds{consumer,topic,partition}``."""
    return PartitionGauge(
        "contextcore_consumer_oldest_in_flight_age_seconds",
        "Age of the unfinished record that holds a partition's commit position back "
        "(0 when nothing is in flight).",
        {"consumer": consumer},
        snapshot,
    )


def consumer_lag(
    consumer: str, group: str, snapshot: Callable[[], Mapping[tuple[str, int], float]]
) -> PartitionGauge:
    """``contextcore_consumer_lag_records{consumer,group,topic,partition}``: records between
    where a restart of this member would resume and the partition's high watermark, for each
    partition it owns (a partition it has received no record of in this assignment is left
    out)."""
    return PartitionGauge(
        "contextcore_consumer_lag_records",
        "Records of a partition this member owns that it has not finished: from where a "
        "restart would resume to the high watermark.",
        {"consumer": consumer, "group": group},
        snapshot,
    )
