"""The operator's commands end to end: ``contextcore dev demo`` and ``contextcore build``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import free_port, run
from tests.services import Config, Database, StartConsumer

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_demo_applies_the_schema_starts_the_consumers_and_prints_the_reply(
    config: Config, empty_database: Database
) -> None:
    settings = config.with_(
        "database",
        url=empty_database.url,
        owner_url=empty_database.owner_url,
        admin_url=empty_database.admin_url,
    ).with_("build", preload_encoder=True)
    code, out, err = await run(
        sys.executable, "-m", "devstack.cli", "demo", env=settings.environ(), timeout=280
    )
    assert code == 0, err
    assert "starting the embedded broker" not in out  # the addresses point elsewhere
    assert "applied 00001_foundation" in out
    reply = json.loads(out[out.index("\n{") + 1 :])
    assert reply["status"] == "ok"
    assert reply["brief"]["failed_sources"] == []
    text = reply["brief"]["text"]
    for heading in (
        "## Conversation",
        "## Application state",
        "## Company dossier",
        "## Agents, workflows and skills",
        "## Run history",
        "## Knowledge",
        "## Personal memory",
        "## Memory",
    ):
        assert heading in text  # every source answered from the seeded demo rows
    assert "lifecycle_stage: customer" in text
    # the demo asks for the manifest and prints it (explain: true): the kept items first
    table = out[out.index("\nitems: ") + 1 :].splitlines()
    assert table[1].split()[:4] == ["outcome", "source", "class", "tokens"]
    assert table[2].startswith("kept ")
    assert "Acme account handbook (organization): ready, 2 chunk(s)" in out
    assert "CRM basics (platform): ready, 1 chunk(s)" in out
    assert "Tuesday mornings" in text  # the organization's document answers the question
    assert "preference.call_notes: written created" in out
    assert "three bullet points" in text  # the user's own memory
    assert "procurement portal" in text  # a memory about Acme, which resolves in this tenant
    deal = {"kind": "crm.deal", "id": "00000000-0000-4000-8000-0000000000d1", "label": None}
    assert deal in reply["brief"]["items"]


async def test_build_cli_publishes_json_files_and_prints_the_reply(
    config: Config, start_consumer: StartConsumer, tmp_path: Path
) -> None:
    await start_consumer(config)
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "subject": {
                    "organization_id": "6f1c2a3b-0000-4000-8000-000000000001",
                    "user_id": None,
                    "trigger_id": None,
                    "definition_id": None,
                },
                "query": "who is Acme?",
                "entities": [{"kind": "crm.company", "id": "c1"}, {"kind": "broken"}],
            }
        )
    )
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "total_token_budget": 100,
                "sources": [],
            }
        )
    )
    env = config.environ()
    # the installed `contextcore`, the broker named by its global option, not the environment
    cli = str(Path(sys.executable).parent / "contextcore")
    bare = {k: v for k, v in env.items() if k != "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"}
    code, out, err = await run(
        cli, "--bootstrap-servers", config.bootstrap, "build", str(request), str(policy),
        "--timeout", "60", env=bare,
    )  # fmt: skip
    assert code == 0, err
    reply = json.loads(out)
    assert reply["status"] == "ok"
    assert reply["brief"]["items"] == []
    code, out, err = await run(
        cli, "--bootstrap-servers", config.bootstrap, "build", str(request), str(policy),
        "--explain", "--timeout", "60", env=bare,
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("brief: 0 tokens, sha256 e3b0c44298fc1c149afbf4c8996fb924")  # of ""
    assert "items: 0 kept, 0 dropped" in out

    nobody = f"127.0.0.1:{free_port()}"
    code, out, err = await run(
        cli, "--bootstrap-servers", nobody, "build", str(request), str(policy), env=bare
    )
    assert code == 3, err  # unavailable: neither a refusal (1) nor a usage error (2)
    [line] = err.strip().splitlines()
    assert line.startswith(f"contextcore build: cannot reach the Kafka broker at {nobody}")

    policy.write_text(json.dumps({"total_token_budget": "100", "sources": []}))
    code, out, err = await run(
        sys.executable, "-m", "producers.build_cli", str(request), str(policy), env=env
    )
    assert code == 1
    assert err.strip() == (
        "contextcore build: invalid input: policy.total_token_budget: Input should be a valid "
        "integer"
    )
