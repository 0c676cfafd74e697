"""A consumer group scaled out and in (issue 34): requests a second with 1, 2 and 3 processes,
and what each join and leave costs the requests in flight, in one run.

    python -m bench.scale [--group build|memory] [--seconds 5] [--step 12] [--load 0.6] [--smoke]

``--group build`` (the default): the demo's typical builds. ``--group memory``: ``remember``
calls over 32 organizations (calls are keyed by organization), each a new user memory (a new
chain), answered ``written``.

1. **Throughput.** For 1, 2 and 3 processes in one group (fresh topics of 4 partitions), with
   ``--outstanding`` requests always waiting, for ``--seconds`` after a warm-up: requests a
   second answered (``ok`` briefs, ``written`` memories). Too few outstanding and the figure is
   that many over the round trip (the long polls' share of it above all), not the group's.
2. **Pauses.** A fresh group of one process; requests paced at ``--load`` times what one process
   sustained in (1); every ``--step`` seconds the group changes as an autoscaler (KEDA) and a
   crash change it: a second process joins, a third joins, one leaves by SIGTERM (it drains
   and commits first), one is killed (``kill -9``: its partitions wait for the group's session
   timeout). For the steady window before the first change and for each change: the longest
   gap between two replies in the ``--step`` seconds from it, the p99 of the requests sent
   then, and the requests that got no reply.

The processes poll the broker every ``--fetch-wait-ms`` (250): on the dev broker (Tansu) a
shorter long poll starves a member that lags behind its partitions' ends, as every member does
after a rebalance (docs/delivery.md), and the pauses would measure that.

Prints figures, never passes or fails; the CPU flags and each process's peak RSS beside them.
``--smoke``: every step and change, a second or a few each (tests/integration/test_bench_smoke.py).
On one machine the processes share its cores: more processes add the group's parallelism,
not cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bench.fairness import (
    OUTSTANDING,
    REPLY_TIMEOUT_S,
    Latencies,
    Tally,
    build_client,
    builder,
    closed_loop,
    cpu_flags,
    deadline,
    fresh_topics,
    paced,
    service_env,
    turns,
)
from bench.processes import peak_rss_mb, start_consumer
from bench.seeded import TYPICAL_POLICY, Org, database_name, drop, prepare, seed
from broker.settings import TopicSettings
from broker.topics import build_topics, memory_topics
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.memory import MemoryClient
from schemas.memory import Invoker, MemoryCandidate

PROCESSES = (1, 2, 3)
CHANGES = ("a second process joins", "a third joins", "one leaves (SIGTERM)", "one is killed")


@dataclass
class Group:
    """The processes of one group, started and stopped as an autoscaler would."""

    consumer: str
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    leaving: list[subprocess.Popen[bytes]] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)

    def join(self) -> None:
        self.processes.append(start_consumer(self.consumer, self.env))

    def leave(self, sig: signal.Signals) -> None:
        """Signal the newest process and return (a SIGTERMed one drains meanwhile)."""
        process = self.processes.pop()
        self.peaks.append(peak_rss_mb(process.pid))
        process.send_signal(sig)
        self.leaving.append(process)

    def stop(self) -> None:
        while self.processes:
            self.leave(signal.SIGTERM)
        for process in self.leaving:
            process.wait(60)


Call = Callable[[int], Awaitable[None]]
Caller = Callable[[Tally, float], Call]
"""A request of the group's flow, its answer counted in a tally, with a reply timeout."""


MEMORY_ORGANIZATIONS = 32
"""The organizations the memory calls take turns over: calls are keyed by organization, so one
organization's go to one partition and one process (32 over 4 partitions reach every one)."""


def rememberer(client: MemoryClient, orgs: list[uuid.UUID], tally: Tally, timeout: float) -> Call:
    """``paced``'s call: one ``remember`` of a new user memory of one of ``orgs`` in turn (a
    chain of its own); a ``written`` answer counts as ``ok``, any other by its reason."""
    definition = uuid.uuid4()

    async def remember(i: int) -> None:
        org = orgs[i % len(orgs)]
        principal = Invoker(organization_id=org, definition_id=definition, user_id=uuid.uuid4())
        memory = MemoryCandidate(scope="user", attribute="preference.tone", text=f"Tone {i}")
        answered = await tally.answered(client.remember(principal, memory, timeout=timeout))
        if answered is None:
            return
        started, ms, answer = answered
        if answer.status == "written":
            tally.ok.append((started, ms))
        else:
            tally.other[answer.reason or answer.status] += 1

    return remember


@contextlib.asynccontextmanager
async def callers(
    group: str, bootstrap: str, topics: TopicSettings, org: Org, orgs: list[uuid.UUID]
) -> AsyncIterator[Caller]:
    """A client of ``group``'s topic, as a maker of calls: builds of ``org``'s turns, or
    memory calls over ``orgs``."""
    if group == "memory":
        async with MemoryClient(
            memory_topic=topics.memory_write,
            bootstrap_servers=bootstrap,
            reply_topic_prefix=topics.reply_prefix,
            fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
        ) as memory:
            yield lambda tally, timeout: rememberer(memory, orgs, tally, timeout)
        return
    async with build_client(bootstrap, topics.build_request, topics.reply_prefix) as client:
        turn = turns(org, 1)
        yield lambda tally, timeout: builder(client, turn, TYPICAL_POLICY, tally, timeout)


@contextlib.asynccontextmanager
async def warm_group(
    args: argparse.Namespace, url: str, org: Org, count: int
) -> AsyncIterator[tuple[Group, Caller]]:
    """``count`` processes of ``args.group`` in a group of their own (fresh topics), and a
    client whose requests of ``org`` have run for 6 s at 20/s: the group settled, the caches
    full."""
    kinds = memory_topics if args.group == "memory" else build_topics
    async with fresh_topics(args.bootstrap, kinds) as (tag, topics):
        poll = f"{args.group.upper()}_FETCH_MAX_WAIT_MS"
        env = service_env(
            args, url, tag, topics, BUILD_PRELOAD_ENCODER="false", **{poll: str(args.fetch_wait_ms)}
        )
        group = Group(args.group, env)
        try:
            for _ in range(count):
                group.join()
            async with callers(args.group, args.bootstrap, topics, org, args.orgs) as caller:
                await paced(20, deadline(args.warm_up), caller(Tally(), REPLY_TIMEOUT_S))
                yield group, caller
        finally:
            group.stop()


async def throughput(args: argparse.Namespace, url: str, org: Org, count: int) -> float:
    """Requests a second ``count`` processes answer, with ``--outstanding`` always waiting."""
    tally = Tally()
    async with warm_group(args, url, org, count) as (_, caller):
        elapsed = await closed_loop(caller(tally, REPLY_TIMEOUT_S), args.seconds, args.outstanding)
    return len(tally.ok) / elapsed


@dataclass(frozen=True)
class Window:
    label: str
    start: float
    end: float

    def line(self, tally: Tally) -> str:
        """The longest gap between replies from ``start`` to ``end``, and the requests sent
        then: their p99 and how many got none."""
        arrivals = sorted(
            started + ms / 1000 for started, ms in tally.ok if self.start <= started + ms / 1000
        )
        within = [self.start, *(t for t in arrivals if t < self.end), self.end]
        gap = max(b - a for a, b in itertools.pairwise(within))
        sent = Latencies("", [ms for started, ms in tally.ok if self.start <= started < self.end])
        return (
            f"  {self.label:28s} longest gap between replies {gap * 1000:7,.0f} ms; the "
            f"{len(sent.values):,} requests sent then: p50 {sent.quantile(0.5):6,.1f} ms, "
            f"p99 {sent.quantile(0.99):7,.1f} ms, max {max(sent.values, default=0):7,.1f} ms"
        )


async def pauses(args: argparse.Namespace, url: str, org: Org, rate: float) -> None:
    tally = Tally()
    async with warm_group(args, url, org, 1) as (group, caller):
        call = caller(tally, args.reply_timeout)
        began = time.perf_counter()
        steps = len(CHANGES) + 1
        load = asyncio.create_task(paced(rate, deadline(steps * args.step), call))
        windows = [Window("steady, one process", began, began + args.step)]
        for k, change in enumerate(CHANGES, start=1):
            await asyncio.sleep(max(0.0, began + k * args.step - time.perf_counter()))
            at = time.perf_counter()
            if k <= 2:
                await asyncio.to_thread(group.join)
            else:
                sig = signal.SIGTERM if k == 3 else signal.SIGKILL
                await asyncio.to_thread(group.leave, sig)
            windows.append(Window(change, at, at + args.step))
        await load
    print(
        f"  {args.group} requests paced at {rate:,.0f}/s ({args.load:g} of one process), a "
        f"change every {args.step:g} s: {tally.answers()}"
    )
    for window in windows:
        print(window.line(tally))
    peaks = ", ".join(f"{p:,.0f} MB" for p in group.peaks)
    print(f"  peak RSS of the {args.group} processes: {peaks}")


SMOKE = {"seconds": 1.0, "step": 4.0, "warm_up": 1.0, "outstanding": 8}
"""``--smoke``: the sizes of a smoke run."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--group", choices=("build", "memory"), default="build")
    parser.add_argument(
        "--outstanding",
        type=int,
        default=OUTSTANDING,
        help="throughput: requests always waiting; too few and the figure is the round trip's "
        f"(at most this many over one round trip), not the group's ({OUTSTANDING})",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="each throughput run")
    parser.add_argument("--step", type=float, default=12.0, help="seconds between changes")
    parser.add_argument("--load", type=float, default=0.6, help="of one process's builds/s")
    parser.add_argument(
        "--reply-timeout",
        type=float,
        default=REPLY_TIMEOUT_S,
        help="pauses: seconds a request waits for its reply before it counts as unanswered",
    )
    parser.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=250,
        help="the build processes' long poll: on the dev broker a short one starves a member "
        "that lags, as each does after a rebalance (docs/scaling.md: at 50 ms, after a "
        "kill -9, 2,448 requests had no reply in 240 s)",
    )
    parser.add_argument(
        "--warm-up", type=float, default=6.0, help="seconds at 20 requests/s before each step"
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    name = database_name("bench_scale", args.smoke)
    seeded = await prepare(name, 0)
    args.bootstrap = seeded.stack.bootstrap_servers
    admin = await asyncpg.connect(seeded.admin_url)
    org = Org()
    print(f"CPU flags: {cpu_flags()}; {os.cpu_count()} cores")
    try:
        await seed(admin, [org])
        args.orgs = [org.id, *(uuid.uuid4() for _ in range(MEMORY_ORGANIZATIONS - 1))]
        await admin.executemany(
            "INSERT INTO organizations (id, name) VALUES ($1, 'bench')",
            [(o,) for o in args.orgs[1:]],
        )
        rates = {}
        for count in PROCESSES:
            rates[count] = await throughput(args, seeded.url, org, count)
            print(
                f"  {count} {args.group} process{'es' if count > 1 else ''}: "
                f"{rates[count]:,.1f} requests/s ({rates[count] / rates[1]:.2f} of one; "
                f"{args.outstanding} always waiting, {args.seconds:g} s)",
                flush=True,
            )
        await pauses(args, seeded.url, org, args.load * rates[1])
    finally:
        await admin.close()
        await drop(seeded.stack, name)


if __name__ == "__main__":
    asyncio.run(main())
