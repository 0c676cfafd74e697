"""Every consumer's ``/metrics`` exposition passes ``promtool check metrics`` (naming, units,
``_total`` counters, help text), with a sample in every family a consumer fills."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from consumers.build.metrics import BuildMetrics
from consumers.knowledge.embed.metrics import EmbedMetrics, TimedEncoder
from consumers.knowledge.sweep.app import Sweeper, SweepSettings
from consumers.knowledge.sweep.postgres import PostgresSweepStore
from consumers.knowledge.upload.metrics import UploadMetrics
from consumers.memory.metrics import MemoryMetrics
from consumers.runtime.metrics import RuntimeMetrics, consumer_lag, oldest_in_flight
from contextcore.storage.settings import DatabaseSettings
from devstack.prometheus import check_metrics
from schemas.context import ContextBrief


def runtime(consumer: str) -> RuntimeMetrics:
    metrics = RuntimeMetrics.create()
    metrics.records.labels(consumer, "reply").inc()
    metrics.stage_seconds.labels(consumer, "decode").observe(0.001)
    metrics.record_seconds.labels(consumer).observe(0.01)
    metrics.dead_letters.labels("t", "gave_up").inc()
    metrics.retries.labels(consumer, "timeout").inc()
    metrics.publish_failures.labels(consumer, "reply").inc()
    metrics.commits.labels(consumer, "ok").inc()
    metrics.in_flight.labels(consumer).set(1)
    metrics.registry.register(oldest_in_flight(consumer, lambda: {("t", 0): 1.5}))
    metrics.registry.register(consumer_lag(consumer, "g", lambda: {("t", 0): 3}))
    return metrics


def build() -> CollectorRegistry:
    metrics = runtime("build")
    build = BuildMetrics.create(metrics.registry)
    build.start_at_zero(["dossier", "knowledge"])
    build.requests.labels("ok").inc()
    build.source_read("dossier", 0.002, "ok", False)
    build.source_read("knowledge", 1.0, "timeout", True)
    build.items_dropped({("dossier", "over_total_budget"): 2})
    build.brief(
        ContextBrief(
            text="x",
            items=[],
            tokens=120,
            per_source_tokens={"dossier": 120},
            dropped={"dossier": 2},
            failed_sources=["knowledge"],
        )
    )
    build.memory_drop_hook()("unresolved_ref")
    return metrics.registry


def memory() -> CollectorRegistry:
    metrics = runtime("memory")
    memory = MemoryMetrics.create(metrics.registry)
    memory.count_write("remember", "written")
    memory.count_write("forget", "refused", "not_live")
    memory.count_change("superseded", 2)
    memory.count_write("remember", "replayed")
    return metrics.registry


def upload() -> CollectorRegistry:
    metrics = runtime("upload")
    UploadMetrics.create(metrics.registry)
    return metrics.registry


class Fixed:
    model = "m"
    dimensions = 2

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


def embed() -> CollectorRegistry:
    metrics = runtime("embed")
    TimedEncoder(Fixed(), EmbedMetrics.create(metrics.registry)).encode(["a", "b"])
    return metrics.registry


def test_each_model_call_is_observed_with_its_passages() -> None:
    registry = CollectorRegistry()
    encoder = TimedEncoder(Fixed(), EmbedMetrics.create(registry))
    assert encoder.encode(["a", "b", "c"]) == [[1.0, 0.0]] * 3
    encoder.encode(["d"])
    assert (encoder.model, encoder.dimensions) == ("m", 2)
    model = {"model": "m"}
    assert registry.get_sample_value("contextcore_embed_encode_seconds_count", model) == 2
    assert registry.get_sample_value("contextcore_embed_encode_texts_sum", model) == 4


def sweep() -> CollectorRegistry:
    settings = SweepSettings(metrics_port=0)
    database = DatabaseSettings(url="postgresql://u:p@127.0.0.1:1/db")
    sweeper = Sweeper(settings, PostgresSweepStore(database), publisher=None)  # type: ignore[arg-type]
    sweeper.failed.inc()
    sweeper.last_sweep.set_to_current_time()
    return sweeper.registry


@pytest.mark.parametrize("registry", [build, memory, upload, embed, sweep])
def test_the_exposition_passes_promtool(registry: object) -> None:
    assert callable(registry)
    exposition = generate_latest(registry()).decode()
    clean, printed = check_metrics(exposition)
    assert clean, printed
    assert "contextcore_schema_info{" in exposition


def test_promtool_refuses_a_badly_named_series() -> None:
    clean, printed = check_metrics(
        "# HELP contextcore_builds Builds.\n# TYPE contextcore_builds counter\n"
        "contextcore_builds 1\n"
    )
    assert not clean
    assert '"_total" suffix' in printed
