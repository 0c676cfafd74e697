"""``k8s/`` renders with kustomize, every object validates (custom resources against their
vendored schemas), and the manifests keep the deployment's rules: probes, resources, one
credential per role, replicas never above partitions, a topic and a dead-letter topic each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.topics import MEMORY_DEAD_LETTER_CONFIGS, MEMORY_WRITE_CONFIGS
from devstack.k8s_validate import render, validate
from monitoring import k8s_rule

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
CONSUMERS = {"build", "memory", "upload", "embed", "sweep"}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(K8S)


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_object_validates() -> None:
    results = validate(K8S)
    assert [(r.name, r.problems) for r in results if r.problems] == []
    kinds = {r.name.split(" ")[0] for r in results}
    assert kinds == {
        "v1/Namespace",
        "v1/ConfigMap",
        "apps/v1/Deployment",
        "batch/v1/Job",
        "batch/v1/CronJob",
        "kafka.strimzi.io/v1beta2/KafkaTopic",
        "keda.sh/v1alpha1/ScaledObject",
        "monitoring.coreos.com/v1/PodMonitor",
        "monitoring.coreos.com/v1/PrometheusRule",
        "postgresql.cnpg.io/v1/Cluster",
        "networking.k8s.io/v1/NetworkPolicy",
    }


BAD = {
    "deployment.yaml": """
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  replica: 2
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec: {containers: [{name: c, image: i}]}
""",
    "scaled.yaml": """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: s}
spec:
  scaleTargetRef: {name: d}
  maxReplicaCount: ten
  triggers: [{type: kafka, metadata: {topic: t}}]
""",
    "topic.yaml": """
apiVersion: kafka.strimzi.io/v1beta2
kind: KafkaTopic
metadata: {name: t}
spec: {partitions: "3", replica: 3}
""",
    "cluster.yaml": """
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata: {name: c}
spec: {instances: one, storage: {size: 1Gi}}
""",
    "widget.yaml": """
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
""",
}


def test_an_unknown_field_a_wrong_type_and_an_unknown_kind_fail(tmp_path: Path) -> None:
    for name, text in BAD.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "kustomization.yaml").write_text("resources: [" + ", ".join(sorted(BAD)) + "]\n")
    (tmp_path / "schemas").symlink_to(K8S / "schemas")
    results = {r.name.split(" ")[0].split("/")[-1]: r.problems for r in validate(tmp_path)}
    assert set(results) == {"Deployment", "ScaledObject", "KafkaTopic", "Cluster", "Widget"}
    assert "replica" in " ".join(results["Deployment"])
    assert "ten" in " ".join(results["ScaledObject"])
    assert "'3'" in " ".join(results["KafkaTopic"])
    assert "replica" in " ".join(results["KafkaTopic"])
    assert "one" in " ".join(results["Cluster"])
    assert "no schema" in " ".join(results["Widget"])


def test_each_consumer_is_probed_sized_and_holds_the_runtime_credential_only(
    objects: list[dict[str, Any]],
) -> None:
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {f"contextcore-{c}" for c in CONSUMERS}
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["contextcore", "serve", name.removeprefix("contextcore-")]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["requests"]["memory"]
        assert container["resources"]["limits"]["memory"]
        secrets = [
            e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e
        ]
        assert secrets == ["contextcore-database-runtime"]
    (job,) = of_kind(objects, "Job").values()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert [e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]] == [
        "contextcore-database-owner"
    ]
    # the indexer: the owner's credential alone, one pass at a time
    (indexer,) = of_kind(objects, "CronJob").values()
    assert indexer["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = indexer["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["contextcore", "knowledge", "index", "--apply"]
    assert [e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]] == [
        "contextcore-database-owner"
    ]


def test_scaling_never_exceeds_partitions_and_every_topic_has_its_dead_letter_topic(
    objects: list[dict[str, Any]],
) -> None:
    config = of_kind(objects, "ConfigMap")["contextcore"]["data"]
    topics = {
        t["spec"]["topicName"]: t["spec"]["partitions"]
        for t in of_kind(objects, "KafkaTopic").values()
    }
    for setting in ("BUILD_REQUEST", "MEMORY_WRITE", "UPLOAD", "EMBED"):
        name = config[f"CONTEXTCORE_TOPIC_{setting}"]
        assert topics[name] == int(config[f"CONTEXTCORE_TOPIC_{setting}_PARTITIONS"])
        assert topics[f"{name}.dlt"] == 1
    scaled = of_kind(objects, "ScaledObject")
    assert set(scaled) == {"contextcore-build", "contextcore-embed"}
    for scaler in scaled.values():
        (trigger,) = scaler["spec"]["triggers"]
        assert trigger["type"] == "kafka"
        assert scaler["spec"]["maxReplicaCount"] <= topics[trigger["metadata"]["topic"]]
        group = trigger["metadata"]["consumerGroup"]
        consumer = scaler["spec"]["scaleTargetRef"]["name"].removeprefix("contextcore-")
        assert group == config[f"CONTEXTCORE_{consumer.upper()}_GROUP_ID"]


def test_memory_text_leaves_the_memory_topics_within_the_bound_the_code_sets(
    objects: list[dict[str, Any]],
) -> None:
    """An erasure cannot reach a record on Kafka: docs/memory.md states the bound, the code
    creates the topics with it (compose), and the manifests set the same."""
    config = of_kind(objects, "ConfigMap")["contextcore"]["data"]
    topics = {t["spec"]["topicName"]: t["spec"] for t in of_kind(objects, "KafkaTopic").values()}
    memory_write = config["CONTEXTCORE_TOPIC_MEMORY_WRITE"]
    for name, configs in (
        (memory_write, MEMORY_WRITE_CONFIGS),
        (f"{memory_write}.dlt", MEMORY_DEAD_LETTER_CONFIGS),
    ):
        manifest = topics[name]["config"]
        assert {k: str(manifest[k]) for k in configs} == configs
    days = (
        int(MEMORY_DEAD_LETTER_CONFIGS["retention.ms"])
        + int(MEMORY_DEAD_LETTER_CONFIGS["segment.ms"])
    ) / 86_400_000
    assert days == 7
    assert "within 7 days" in (ROOT / "docs" / "memory.md").read_text()


def test_the_database_bootstrap_makes_the_roles_and_pgvector(objects: list[dict[str, Any]]) -> None:
    (cluster,) = of_kind(objects, "Cluster").values()
    initdb = cluster["spec"]["bootstrap"]["initdb"]
    assert initdb["owner"] == "contextcore_owner"
    assert "CREATE EXTENSION IF NOT EXISTS vector" in initdb["postInitApplicationSQL"]
    assert "CREATE ROLE contextcore_app NOLOGIN NOINHERIT" in initdb["postInitApplicationSQL"]
    (runtime,) = cluster["spec"]["managed"]["roles"]
    assert runtime["name"] == "contextcore_runtime"
    assert runtime["inRoles"] == ["contextcore_app"]
    assert (runtime["login"], runtime["inherit"], runtime["bypassrls"]) == (True, False, False)


def test_the_prometheus_rule_is_the_alert_rules() -> None:
    assert k8s_rule.main(["--check"]) == 0


def test_only_prometheus_reaches_the_consumers_and_only_contextcore_the_database(
    objects: list[dict[str, Any]],
) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    consumers = policies["contextcore-consumers"]["spec"]
    assert consumers["podSelector"]["matchLabels"] == {"app.kubernetes.io/part-of": "contextcore"}
    (rule,) = consumers["ingress"]
    assert rule["ports"] == [{"port": "metrics"}]
    database = policies["contextcore-database"]["spec"]
    postgres = next(r for r in database["ingress"] if r["ports"] == [{"port": 5432}])
    assert all("namespaceSelector" not in peer for peer in postgres["from"])
    # every Deployment's pods carry the label the policies select
    for deployment in of_kind(objects, "Deployment").values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "contextcore"
