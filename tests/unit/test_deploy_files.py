"""The deploy files name commands, settings and images that exist in this repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from broker.settings import KafkaSettings, TopicSettings
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.sweep.app import SweepSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings
from producers.command import commands

ROOT = Path(__file__).resolve().parents[2]
CLIENT = tomllib.loads((ROOT / "packaging" / "client" / "pyproject.toml").read_text())
SCRIPTS = set(CLIENT["project"]["scripts"])
SHIPPED = {name.split(".")[0] for name in commands()} - {"dev"}
"""The subcommands the two shipped distributions bring (the dev tools' ``dev`` is not in the
image)."""
SETTINGS = {
    f"{group.model_config.get('env_prefix', '')}{name}".upper()
    for group in (
        KafkaSettings,
        TopicSettings,
        DatabaseSettings,
        BuildSettings,
        MemorySettings,
        UploadSettings,
        EmbedSettings,
        SweepSettings,
        KnowledgeSettings,
    )
    for name in group.model_fields
}


def k8s_documents() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted((ROOT / "k8s").glob("*.yaml")):
        documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return documents


def containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def test_every_k8s_document_has_a_kind_and_the_kustomization_lists_real_files() -> None:
    documents = k8s_documents()
    assert all({"apiVersion", "kind"} <= doc.keys() for doc in documents)
    kustomization = yaml.safe_load((ROOT / "k8s" / "kustomization.yaml").read_text())
    assert all((ROOT / "k8s" / name).exists() for name in kustomization["resources"])


def test_k8s_and_compose_commands_are_installed_scripts_and_settings_exist() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [c["command"] for doc in k8s_documents() for c in containers(doc)]
    commands += [
        s["command"]
        for s in compose["services"].values()
        if "command" in s and s.get("image", "").startswith("contextcore")
    ]
    assert commands
    assert {command[0] for command in commands} <= SCRIPTS
    assert {command[1] for command in commands} <= SHIPPED

    config = next(d for d in k8s_documents() if d["kind"] == "ConfigMap")
    assert set(config["data"]) <= SETTINGS
    for service in compose["services"].values():
        names = {n for n in service.get("environment", {}) if n.startswith("CONTEXTCORE_")}
        assert names <= SETTINGS


PRIVILEGED = {"CONTEXTCORE_DATABASE_OWNER_URL", "CONTEXTCORE_DATABASE_ADMIN_URL"}


def test_services_hold_the_runtime_credential_and_never_the_owners() -> None:
    """Two credentials (issue 7): a consumer never holds the owner's or the admin's URL."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    serving = [
        s
        for s in compose["services"].values()
        if s.get("command", [])[:2] == ["contextcore", "serve"]
    ]
    assert serving
    for service in serving:
        assert "CONTEXTCORE_DATABASE_URL" in service["environment"]
        assert not PRIVILEGED & set(service["environment"])
    [init] = [
        s
        for s in compose["services"].values()
        if s.get("command") == ["contextcore", "schema", "init"]
    ]
    assert set(init["environment"]) == {"CONTEXTCORE_DATABASE_OWNER_URL"}

    for document in k8s_documents():
        for container in containers(document):
            secrets = {
                e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e
            } | {
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            }
            if container["command"][:2] == ["contextcore", "serve"]:
                assert secrets == {"contextcore-database-runtime"}
            else:
                assert secrets == {"contextcore-database-owner"}


def test_the_readme_and_docs_link_only_to_files_in_this_repository() -> None:
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = document.read_text()
        assert "../shared" not in text, document
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            assert "://" not in target, (document, target)
            assert (document.parent / target).resolve().is_relative_to(ROOT), (document, target)
            assert (document.parent / target).exists(), (document, target)
