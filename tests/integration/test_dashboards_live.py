"""The dashboards against a real Prometheus: it scrapes every consumer (build, memory, upload,
embedding, sweep) through a short mixed load (builds, memory writes, one upload, one poison
record), then every panel's query runs through Prometheus's HTTP API. No panel may come back
empty: an empty panel is a query over a series nobody exports (a typo, a renamed label)."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from broker.topics import all_topics, ensure_topics
from devstack.prometheus import binary
from monitoring.dashboards import RATE, queries
from producers.client import ContextClient
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject
from schemas.memory import Invoker, MemoryCandidate
from tests.integration import seed
from tests.integration.helpers import free_port, producer, read_json
from tests.integration.test_knowledge_pipeline import upload
from tests.services import Config, StartConsumer

pytestmark = pytest.mark.integration

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
CONSUMERS = ("build", "memory", "upload", "embed", "sweep")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


async def prometheus(
    tmp_path: Path, targets: dict[str, int]
) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(MONITORING / "alerts.yml")],
        "scrape_configs": [
            {
                "job_name": "contextcore",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{p}"], "labels": {"service": name}}
                    for name, p in targets.items()
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "tsdb").mkdir()
    with (tmp_path / "prometheus.log").open("wb") as log:  # the child keeps its own copy
        process = await asyncio.create_subprocess_exec(
            binary("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
    return process, f"http://127.0.0.1:{port}"


async def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = await asyncio.to_thread(get_json, url)
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _number(text: str) -> float:
    value = float(text)
    return value if value == value else float("-inf")  # NaN sorts last


async def until(check: Any, timeout: float, what: str) -> None:
    for _ in range(int(timeout * 2)):
        if await check():
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"not within {timeout:g} s: {what}")


@pytest.mark.timeout(420)
async def test_every_dashboard_panel_returns_series_from_a_real_prometheus(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    org = await seed.organization(admin)
    ports = {name: free_port() for name in CONSUMERS}
    for name in ("build", "memory", "upload", "embed"):
        config = config.with_(name, metrics_port=ports[name])
    await ensure_topics(config.bootstrap, all_topics(config.topics))
    await asyncio.gather(*(start_consumer(config, consumer=name) for name in CONSUMERS[:4]))
    with (tmp_path / "sweep.log").open("wb") as log:
        sweep = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumers.cli",
            "serve",
            "sweep",
            env={
                **config.environ(),
                "CONTEXTCORE_SWEEP_METRICS_PORT": str(ports["sweep"]),
                "CONTEXTCORE_SWEEP_INTERVAL_S": "2",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    server, base = await prometheus(tmp_path, ports)
    try:
        assert sweep.stdout is not None
        line = await asyncio.wait_for(sweep.stdout.readline(), 60)
        assert line.startswith(b"sweep ready"), line

        async def all_up() -> bool:
            try:
                up = await query(base, "up")
            except OSError:
                return False
            return len(up) == len(CONSUMERS) and all(s["value"][1] == "1" for s in up)

        await until(all_up, 60, "every consumer scraped")

        # the load, in two waves a few scrapes apart (a rate needs two samples that differ):
        # builds, memory writes (one refused as a duplicate, one forget of a revision that is
        # no longer live), then one upload and one poison record
        user, definition = uuid.uuid4(), uuid.uuid4()
        principal = Invoker(organization_id=org, definition_id=definition, user_id=user)
        policy = ContextPolicy(
            total_token_budget=600,
            sources=[
                ContextSourceSpec(name=name, token_budget=150)
                for name in ("memory", "application", "dossier", "run_history")
            ],
        )
        request = ContextRequest(
            subject=ContextSubject(
                organization_id=org, user_id=user, trigger_id=None, definition_id=definition
            ),
            query="how should I answer?",
            entities=(),
        )
        async with (
            MemoryClient.from_settings(config.kafka, config.topics) as memory,
            ContextClient.from_settings(config.kafka, config.topics) as client,
        ):
            tone = "preference.tone"
            first = await memory.remember(
                principal, MemoryCandidate(scope="user", attribute=tone, text="brief")
            )
            assert first.status == "written"
            assert first.memory is not None
            for _ in range(5):
                await client.build(request, policy, timeout=30)
            await asyncio.sleep(3)
            for text in ("brief", "detailed"):  # a duplicate, then a supersede
                await memory.remember(
                    principal, MemoryCandidate(scope="user", attribute=tone, text=text)
                )
            forgot = await memory.forget(principal, first.memory.id)
            assert forgot.reason == "not_live"
            for _ in range(5):
                await client.build(request, policy, timeout=30)
        reply_to = config.reply_topic("upload")
        send = await producer(config.bootstrap)
        try:
            message = upload("live-1", reply_to, organization=org)
            await send.send_and_wait(config.topics.upload, json.dumps(message).encode())
            await send.send_and_wait(config.topics.build_request, b"not json")  # a dead letter
        finally:
            await send.stop()
        statuses = await read_json(config.bootstrap, reply_to, until=2, timeout=180)
        assert [s["status"] for s in statuses] == ["pending", "ready"]

        async def dead_letter_seen() -> bool:
            found = await query(base, "sum(contextcore_dead_letters_total)")
            return bool(found) and float(found[0]["value"][1]) >= 1

        await until(dead_letter_seen, 30, "the poison record's dead letter scraped")
        await asyncio.sleep(3)  # a few more scrapes after the last record

        report: list[str] = []
        empty: list[str] = []
        for uid, title, expr in queries():
            series = await query(base, expr.replace(RATE, "1m"))
            if not series:
                empty.append(f"{uid} / {title}: {expr}")
                continue
            top = max(series, key=lambda s: _number(s["value"][1]))
            if _number(top["value"][1]) == float("-inf"):  # a quantile over no observation
                empty.append(f"{uid} / {title}: only NaN: {expr}")
                continue
            report.append(
                f"{uid} / {title}: {len(series)} series, the largest "
                f"{json.dumps(top['metric'])} = {float(top['value'][1]):.4g}"
            )
        print("\n".join(report))
        assert empty == []
        # and the load shows where it should
        for expr in (
            'sum(rate(contextcore_build_requests_total{outcome="ok"}[1m]))',
            'sum(rate(contextcore_memory_writes_total{reason="duplicate"}[1m]))',
            'sum(rate(contextcore_memory_revisions_total{change="superseded"}[1m]))',
            "sum(increase(contextcore_dead_letters_total[1h]))",
            "sum(rate(contextcore_chunks_embedded_total[1m]))",
            "sum(contextcore_knowledge_sources_ready_total)",
        ):
            (found,) = await query(base, expr)
            assert float(found["value"][1]) > 0, expr
    finally:
        for process in (server, sweep):
            if process.returncode is None:
                process.terminate()
                await asyncio.wait_for(process.wait(), 30)
