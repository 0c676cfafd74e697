"""Failover: how long the partitions of a consumer killed with ``kill -9`` go unanswered.

Two build consumers share a group on a 4-partition topic while a generator sends 40 typical
requests a second over every partition. One consumer is killed; the figure is the time from the
kill until the last request sent in the second after it is answered (the requests that landed on
the dead member's partitions wait for the group to hand those partitions over). Configurations:
session timeouts (the broker waits that long for a silent member, then rebalances) and static
membership (the killed process restarts at once under the same ``group.instance.id``). Prints
figures; never passes or fails.

    .venv/bin/python -m bench.failover [--rounds 2] [--smoke]

``--smoke``: one round of the quickest configuration (session 3 s: the others wait longer for
the same steps), on a database of its own; a round whose requests were never all answered exits
non-zero (tests/integration/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from bench.e2e import BOOTSTRAP, ROOT, Client, free_port, request_maker
from bench.seeded import database_name, drop, prepare
from broker.topics import TopicSpec, ensure_topics
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS


@dataclass(frozen=True)
class Setup:
    label: str
    session_timeout_ms: int
    heartbeat_interval_ms: int
    static: bool = False


SETUPS = [
    Setup("session 10 s (before issue 7)", 10_000, 3_000),
    Setup("session 6 s (the default)", 6_000, 2_000),
    Setup("session 3 s", 3_000, 1_000),
    Setup("session 6 s, static membership, restart", 6_000, 2_000, static=True),
]


def start(
    setup: Setup, url: str, topic: str, reply_prefix: str, group: str, member: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP[0],
            "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": str(TANSU_FETCH_MAX_WAIT_MS),
            "CONTEXTCORE_KAFKA_SESSION_TIMEOUT_MS": str(setup.session_timeout_ms),
            "CONTEXTCORE_KAFKA_HEARTBEAT_INTERVAL_MS": str(setup.heartbeat_interval_ms),
            "CONTEXTCORE_DATABASE_URL": url,
            "CONTEXTCORE_TOPIC_BUILD_REQUEST": topic,
            # the reply-topic rule: the generator's reply topic is under this prefix, and the
            # consumer answers no topic outside it (broker/reply_topics.py)
            "CONTEXTCORE_TOPIC_REPLY_PREFIX": reply_prefix,
            "CONTEXTCORE_BUILD_GROUP_ID": group,
            "CONTEXTCORE_BUILD_METRICS_PORT": str(free_port()),
        }
    )
    if setup.static:
        env["CONTEXTCORE_KAFKA_GROUP_INSTANCE_ID"] = member
    process = subprocess.Popen(
        [sys.executable, "-m", "consumers.cli", "serve", "build"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    if not process.stdout.readline().startswith(b"build consumer ready"):
        raise RuntimeError("the consumer did not start")
    return process


def one_round(setup: Setup, url: str, make_for: object) -> float:
    tag = uuid.uuid4().hex[:8]
    topic = f"failover.{tag}"
    reply_prefix = f"failover.{tag}.reply"
    reply_topic = f"{reply_prefix}.generator"
    asyncio.run(ensure_topics(BOOTSTRAP[0], [TopicSpec(topic, 4), TopicSpec(reply_topic, 1)]))
    group = f"failover-{uuid.uuid4().hex[:6]}"
    client = Client(BOOTSTRAP[0], reply_topic)
    make = make_for(reply_topic)  # type: ignore[operator]
    processes: list[subprocess.Popen[bytes]] = []
    sent: dict[bytes, float] = {}
    stop = threading.Event()

    def generate() -> None:
        i = 0
        while not stop.is_set():
            cid = f"f-{i}"
            sent[cid.encode()] = time.perf_counter()
            client.producer.produce(topic, make(cid), key=cid.encode())
            client.producer.poll(0)
            i += 1
            time.sleep(1 / 40)

    generator = threading.Thread(target=generate, daemon=True)
    try:  # a member that started is stopped even when the other one does not start
        for i in range(2):
            processes.append(start(setup, url, topic, reply_prefix, group, f"member-{i}"))
        generator.start()
        deadline = time.perf_counter() + 60  # until both members serve (every reply is fast)
        while time.perf_counter() < deadline:
            time.sleep(1)
            recent = [
                c for c, t in sent.items() if time.perf_counter() - 3 < t < time.perf_counter() - 1
            ]
            if recent and all(
                c in client.arrived and client.arrived[c] - sent[c] < 0.5 for c in recent
            ):
                break
        time.sleep(2)
        processes[0].send_signal(signal.SIGKILL)
        killed_at = time.perf_counter()
        processes[0].wait()
        if setup.static:
            processes[0] = start(setup, url, topic, reply_prefix, group, "member-0")
        time.sleep(1)
        after = [c for c, t in sent.items() if killed_at <= t < killed_at + 1]
        limit = time.perf_counter() + 90
        while time.perf_counter() < limit and not all(c in client.arrived for c in after):
            time.sleep(0.05)
        return max(client.arrived.get(c, float("inf")) for c in after) - killed_at
    finally:
        stop.set()
        if generator.ident is not None:  # started
            generator.join()
        client.close()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one round of session 3 s")
    args = parser.parse_args()
    if args.smoke:  # its rounds, unless given
        parser.set_defaults(rounds=1)
        args = parser.parse_args()
    name = database_name("bench_failover", args.smoke)
    seeded = asyncio.run(prepare(name, 3))
    BOOTSTRAP.append(seeded.stack.bootstrap_servers)
    os.environ["CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS"] = str(TANSU_FETCH_MAX_WAIT_MS)
    try:
        for setup in [SETUPS[2]] if args.smoke else SETUPS:
            times = [
                one_round(setup, seeded.url, lambda t: request_maker(seeded.orgs, t, "typical"))
                for _ in range(args.rounds)
            ]
            print(
                f"{setup.label:<44} unanswered after kill -9: median "
                f"{statistics.median(times):5.1f} s  ({', '.join(f'{t:.1f}' for t in times)})",
                flush=True,
            )
            if args.smoke and not all(math.isfinite(t) for t in times):
                raise SystemExit(f"smoke: {setup.label}: requests never answered")
    finally:
        asyncio.run(drop(seeded.stack, name))


if __name__ == "__main__":
    main()
