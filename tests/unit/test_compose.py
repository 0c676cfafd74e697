"""docker-compose.yml runs the whole stack: every consumer as its own service on the runtime
login, the schema init on the owner's, Prometheus scraping every metrics port with the alert
rules, Grafana with the generated dashboards. (CI also validates the file against the compose
specification.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings

from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.sweep.app import SweepSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS: dict[str, type[BaseSettings]] = {
    "build": BuildSettings,
    "memory": MemorySettings,
    "upload": UploadSettings,
    "embed": EmbedSettings,
    "sweep": SweepSettings,
}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_every_consumer_is_a_service_on_the_runtime_login_with_a_health_check() -> None:
    services = compose()["services"]
    for consumer, settings in CONSUMERS.items():
        (name,) = [
            name
            for name, service in services.items()
            if service.get("command") == ["contextcore", "serve", consumer]
        ]
        service = services[name]
        environment = service["environment"]
        assert "contextcore_runtime" in environment["CONTEXTCORE_DATABASE_URL"]
        assert not any("OWNER" in key or "ADMIN" in key for key in environment)
        port = environment[f"CONTEXTCORE_{consumer.upper()}_METRICS_PORT"]
        assert port == str(settings.model_fields["metrics_port"].default)
        assert f"127.0.0.1:{port}/healthz" in " ".join(service["healthcheck"]["test"])
        assert service["depends_on"]["schema-init"]["condition"] == "service_completed_successfully"
        assert service["deploy"]["resources"]["limits"]["memory"]


def test_batch_consumers_weigh_less_on_a_contended_host() -> None:
    """Issue 33: the upload and embedding containers' CPU weight is under the build and memory
    consumers' (the default, 1024): a process's SCHED_IDLE orders only the threads inside its
    own container."""
    services = compose()["services"]
    weights = {
        service["command"][-1]: service.get("cpu_shares", 1024)
        for service in services.values()
        if service.get("command", [])[:2] == ["contextcore", "serve"]
    }
    assert max(weights["upload"], weights["embed"]) < min(weights["build"], weights["memory"])


def test_only_the_schema_jobs_hold_the_owner_credential() -> None:
    """The provisioning, the migrations and the indexer (CREATE INDEX CONCURRENTLY), never a
    consumer; the indexer holds no runtime credential beside it."""
    services = compose()["services"]
    holders = {
        name
        for name, service in services.items()
        if "CONTEXTCORE_DATABASE_OWNER_URL" in (service.get("environment") or {})
    }
    assert holders == {"db-provision", "schema-init", "knowledge-indexer"}
    indexer = services["knowledge-indexer"]
    assert indexer["command"][:3] == ["contextcore", "knowledge", "index"]
    assert set(indexer["environment"]) == {"CONTEXTCORE_DATABASE_OWNER_URL"}


def test_prometheus_scrapes_every_metrics_port_and_loads_the_rules() -> None:
    services = compose()["services"]
    config = yaml.safe_load((ROOT / "monitoring" / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    } | {  # a scaled service: every replica, by DNS
        f"{name}:{sd['port']}"
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    expected = set()
    for consumer in CONSUMERS:
        (name,) = [
            n for n, s in services.items() if s.get("command") == ["contextcore", "serve", consumer]
        ]
        port = services[name]["environment"][f"CONTEXTCORE_{consumer.upper()}_METRICS_PORT"]
        expected.add(f"{name}:{port}")
    assert targets == expected
    mounts = " ".join(services["prometheus"]["volumes"])
    assert "./monitoring/alerts.yml:/etc/prometheus/alerts.yml" in mounts
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_grafana_is_provisioned_with_the_generated_dashboards() -> None:
    mounts = " ".join(compose()["services"]["grafana"]["volumes"])
    assert "./monitoring/grafana/dashboards:/var/lib/grafana/dashboards" in mounts
    assert "./monitoring/grafana/provisioning:/etc/grafana/provisioning" in mounts
    provider = yaml.safe_load(
        (ROOT / "monitoring/grafana/provisioning/dashboards/contextcore.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
