"""Round-trip latency of the walking skeleton: ContextClient → build consumer → reply.

Prints figures, never passes or fails. What it measures, on one run:

* cold start of the embedded stack in a fresh home on spare ports (broker; PostgreSQL initdb+start);
* p50/p90/p99/max of N sequential build round trips with the configured fetch_max_wait_ms (20 ms),
  and of a shorter run with aiokafka's default 500 ms as the baseline the setting replaces;
* the build consumer's peak RSS (VmHWM) under that load.

    .venv/bin/python bench/skeleton_roundtrip.py [--requests 1000] [--baseline-requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from consumers.devstack import DevSettings, DevStack
from consumers.topics import all_topics
from contextcore.models import ContextPolicy, ContextRequest, ContextSubject
from contextcore.settings import Settings
from contextcore.storage import migrations
from contextcore.storage.pool import connect
from producers.client import ContextClient

REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
    ),
    query="bench",
    entities=(),
)
POLICY = ContextPolicy(total_token_budget=1000, sources=[])


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def round_trips(settings: Settings, count: int, fetch_max_wait_ms: int) -> list[float]:
    tag = uuid.uuid4().hex[:8]
    settings = settings.model_copy(
        update={
            "topic_build_request": f"bench.{tag}.build-request",
            "build_group_id": f"bench-{tag}",
            "kafka_fetch_max_wait_ms": fetch_max_wait_ms,
            "metrics_port": 0,
        }
    )
    env = {**os.environ, **settings.environ()}
    consumer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumers.cli",
        "serve",
        "build",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    assert consumer.stdout is not None
    await consumer.stdout.readline()  # "build consumer ready"
    try:
        async with ContextClient.from_settings(settings) as client:
            for _ in range(10):  # warm-up: the group join, connections, first fetches
                await client.request(REQUEST, POLICY, timeout=60)
            timings: list[float] = []
            for _ in range(count):
                started = time.perf_counter()
                reply = await client.request(REQUEST, POLICY, timeout=30)
                timings.append(time.perf_counter() - started)
                assert reply.status == "ok"
        rss = peak_rss_mb(consumer.pid)
    finally:
        consumer.terminate()
        await consumer.wait()
    print(f"  build consumer peak RSS: {rss:.0f} MB")
    return timings


def report(label: str, timings: list[float]) -> float:
    ms = [t * 1000 for t in timings]
    p50 = statistics.median(ms)
    print(
        f"{label}: n={len(ms)} p50={p50:.2f} ms p90={percentile(ms, 0.9):.2f} ms "
        f"p99={percentile(ms, 0.99):.2f} ms max={max(ms):.2f} ms"
    )
    return p50


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--baseline-requests", type=int, default=40)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir="/var/tmp") as home:
        os.chmod(home, 0o755)
        stack = DevStack(DevSettings(home=Path(home), kafka_port=29092, pg_port=25432))
        report_up = await stack.up(all_topics(Settings()))
        print(
            f"cold start: broker {report_up.broker_start_s:.2f} s (incl. topic creation), "
            f"postgres {report_up.postgres_start_s:.2f} s (initdb + start + create database)"
        )
        try:
            settings = Settings(
                kafka_bootstrap_servers=report_up.addresses.bootstrap_servers,
                database_url=report_up.addresses.database_url,
            )
            conn = await connect(settings.require_database_url())
            try:
                await migrations.apply_pending(conn)
            finally:
                await conn.close()
            fast = report(
                f"fetch_max_wait_ms=20, {args.requests} sequential round trips",
                await round_trips(settings, args.requests, 20),
            )
            slow = report(
                "fetch_max_wait_ms=500 (aiokafka default), baseline",
                await round_trips(settings, args.baseline_requests, 500),
            )
            print(f"p50 ratio baseline/configured: {slow / fast:.1f}x")
        finally:
            await asyncio.to_thread(stack.down)


if __name__ == "__main__":
    asyncio.run(main())
