"""A soak: minutes of mixed load at fixed rates, and what they do to the consumers over time.

    .venv/bin/python -m bench.soak [--duration 600] [--interval 30] [--build-rate 40]
        [--memory-rate 40] [--upload-rate 0.5] [--organizations 5] [--smoke]

Starts (or reuses) the embedded stack, seeds a database of its own (``bench_soak``: organizations
seeded like ``bench/sources.py``), makes topics of its own, and starts five processes, each
``contextcore serve ...`` with a consumer group of its own: the build, memory, upload (with its
extraction workers) and embedding consumers, and the pending sweep. Then it drives an open loop,
each request launched at its own slot whatever the latency of the others:

* builds (``ContextClient``): a typical turn about a seeded company and deal, under the demo's
  policy (all seven sources), so every build also reads the memories and documents written here;
* memory writes (``MemoryClient``): new chains, revisions, forgets and revivals, and one call in
  twenty re-observing unchanged text, whose ``duplicate`` refusal is the expected answer;
* uploads (``KnowledgeClient``, each waiting for ``ready``): distinct small markdown documents,
  one in four a new version of an earlier one.

How to read it. Every ``--interval`` seconds, one line per kind: the requests answered in that
window per second, their p50/p99, how late the generator launched its worst one (``late``), and
the errors so far; an error is an error reply, an answer other than the expected one, or no
answer within the timeout (build 10 s, memory 30 s, upload 120 s). Latency runs from the moment
a request was due to its final answer, so a generator that falls behind cannot hide a slow
consumer. Then each consumer's resident memory (VmRSS; the upload consumer's extraction workers
apart), the CPU seconds each process spent in the window, and what each consumer's delivery
runtime says in its /metrics: the records it settled in the window, its lag, its dead letters.
A steady soak shows a flat p99 and flat RSS after the first minutes; a leak shows RSS climbing
window after window; a store that slows as it grows shows CPU per window climbing at a fixed
rate; a consumer that settles more than its callers see answered is answering callers that have
already given up.

The closing summary: totals, errors by cause, the whole run's p50/p99 per kind, each consumer's
RSS at two minutes (at 20% of a run shorter than ten) and at the end with its growth (target
under 10%), and its peak (VmHWM; targets under 300 MB for the build, memory and upload
consumers, under 1.5 GB for the embedding consumer). Prints figures; never passes or fails.
``--smoke``: seconds of low rates (every kind of call, every report), on a database of its own;
a kind of call never answered exits non-zero (tests/integration/test_bench_smoke.py).

On the dev broker (Tansu, memory storage) a partition costs more CPU per record as its log grows
(docs/performance.md). A client's reply topic has one partition, so the build and memory clients
are replaced by new ones, with new reply topics, every ``--rotate-s`` (30 s): with one client
each, Tansu's CPU per window doubled within 90 s at the default rates, while with new reply
topics every 15 s it stayed within a third. The request topics still grow, as they would on a
real broker. PostgreSQL's CPU counts every database of the shared dev stack, and the machine's
busy time is printed beside it: compare windows of one run, on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import asyncpg

from bench.corpora import CACHE
from bench.e2e import free_port
from bench.processes import machine_busy_seconds, start_consumer, status_mb, tree_cpu_seconds
from bench.seeded import TYPICAL_POLICY, Org, database_name, drop, prepare, request_for
from broker.settings import TopicSettings
from broker.topics import all_topics, delete_topics, ensure_topics
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS, DevStack
from producers.client import ChannelOptions, ContextClient, ReplyChannel
from producers.knowledge import KnowledgeClient
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextSourceSpec
from schemas.errors import ReplyTimeout, RequestRefused
from schemas.memory import Invoker, MemoryCandidate, MemorySubjectRef

DATABASE = "bench_soak"
BUILD_TIMEOUT_S = 10.0  # the clients' defaults for builds and memory writes
MEMORY_TIMEOUT_S = 30.0
UPLOAD_TIMEOUT_S = 120.0  # a small document not ready in two minutes is an error here
STOP_BOUND_S = 30.0  # SIGTERM, then SIGKILL (the consumers drain for up to 20 s)
RETIRE_AFTER_S = 60.0
"""A replaced client closes (and deletes its reply topic) this long after: well past its calls'
timeouts, since a consumer that lags still answers callers that gave up, and a reply to a topic
being deleted is refused (the consumer then sends an error reply or dead-letters the record)."""
CONSUMERS = ("build", "memory", "upload", "embed", "sweep")
SCRAPED = ("build", "memory", "upload", "embed")
"""The consumers whose /metrics the soak reads (the sweep has no delivery runtime)."""
PEAK_TARGET_MB = {"build": 300.0, "memory": 300.0, "upload": 300.0, "embed": 1_500.0}
GROWTH_TARGET = 0.10
WORKER = b"contextcore.knowledge.adapters.worker"

POLICY = ContextPolicy(
    total_token_budget=1_700,
    sources=[
        *TYPICAL_POLICY.sources,
        ContextSourceSpec(
            name="knowledge",
            token_budget=300,
            limit=3,
            options={"include_platform": True, "include_organization": True},
        ),
        ContextSourceSpec(name="memory", token_budget=200),
    ],
)
"""The demo's policy: the five sources of a typical turn, knowledge and memory."""

VOCABULARY = (
    "renewal procurement discount onboarding invoice pipeline forecast contract quota territory "
    "churn upsell demo pricing security compliance integration migration support escalation "
    "roadmap budget signature champion stakeholder pilot rollout training warehouse shipping "
    "refund licence audit quarterly agenda"
)
WORDS = VOCABULARY.split()
"""What documents, memories and build queries are made of: builds search the uploads' words."""


# ------------------------------------------------------------------------------ the tallies


class Unexpected(Exception):
    """An answer arrived, but not the one the call was due (a wrong change, a refusal)."""


@dataclass
class Tally:
    """One kind of request: what was launched and answered, in the window and in the whole run."""

    kind: str
    sent: int = 0
    in_flight: int = 0
    latencies: list[float] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    late: float = 0.0
    """The generator's worst launch delay behind a slot in this window, in seconds."""
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    notes: Counter[str] = field(default_factory=Counter)
    """Answers that are not errors but worth a count: expected refusals, degraded briefs."""

    def error(self, cause: str, example: str) -> None:
        self.errors[cause] += 1
        self.examples.setdefault(cause, example[:200])

    async def attempt(self, due: float, call: Callable[[], Awaitable[None]]) -> None:
        """Run one request due at ``due`` (loop time): its latency, or why it failed."""
        loop = asyncio.get_running_loop()
        self.sent += 1
        self.in_flight += 1
        answered = True
        try:
            await call()
        except ReplyTimeout as error:
            answered = False
            self.error("timeout", str(error))
        except RequestRefused as error:  # an error reply, a failed or superseded upload
            self.error(f"refused: {error.code}", str(error))
        except Unexpected as error:
            self.error(str(error).split(":", 1)[0], str(error))
        except Exception as error:  # the bench's own trouble counts too, with its type
            answered = False
            self.error(type(error).__name__, str(error))
        finally:
            self.in_flight -= 1
        if answered:
            latency = loop.time() - due
            self.latencies.append(latency)
            self.window.append(latency)

    def line(self, label: str, window_s: float) -> str:
        rate = len(self.window) / window_s if window_s > 0 else 0.0
        causes = ", ".join(f"{c} {n}" for c, n in self.errors.most_common(3))
        text = (
            f"{label} {self.kind:<7} answered {len(self.window):>6,} ({rate:6.2f}/s)  "
            f"p50 {ms(percentile(self.window, 0.5))}  p99 {ms(percentile(self.window, 0.99))}  "
            f"late {self.late * 1000:5.0f} ms  in flight {self.in_flight:>3}  "
            f"errors so far {sum(self.errors.values())}"
        )
        self.window = []
        self.late = 0.0
        return text + (f" ({causes})" if causes else "")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float | None) -> str:
    return "      -   " if seconds is None else f"{seconds * 1000:7.1f} ms"


# ---------------------------------------------------------------------------- the workloads

C = TypeVar("C", bound=ReplyChannel)


class Rotation(Generic[C]):
    """A client that is replaced by a new one, with a new reply topic, every ``every_s``
    (0: never); the old one closes ``RETIRE_AFTER_S`` later.

    A client's reply topic has one partition, and Tansu's memory storage costs more CPU per
    record as a partition's log grows (docs/performance.md): at 40 replies a second one reply
    partition holds 24,000 records after ten minutes, and the soak would measure the dev
    broker's history rather than the service.
    """

    def __init__(self, make: Callable[[], C], *, every_s: float) -> None:
        self.make, self.every_s = make, every_s
        self._current: C | None = None
        self._retiring: dict[C, asyncio.Task[None]] = {}
        self.reply_topics: list[str] = []
        """Every reply topic its clients made: a late reply re-creates a deleted topic on
        Tansu (it creates topics on demand), so they are deleted again once the consumers stop."""

    @property
    def client(self) -> C:
        assert self._current is not None, "start() was not called"
        return self._current

    async def start(self) -> None:
        self._current = self.make()
        self.reply_topics.append(self._current.reply_topic)
        await self._current.start()

    async def run(self, until: float) -> None:
        """Replace the client every ``every_s`` until loop time ``until``."""
        loop = asyncio.get_running_loop()
        while self.every_s > 0 and loop.time() + self.every_s < until:
            await asyncio.sleep(self.every_s)
            fresh = self.make()
            self.reply_topics.append(fresh.reply_topic)
            await fresh.start()
            old, self._current = self.client, fresh
            self._retiring[old] = asyncio.create_task(self._retire(old))

    async def _retire(self, old: C) -> None:
        await asyncio.sleep(RETIRE_AFTER_S)
        await old.close()
        del self._retiring[old]

    async def close(self) -> None:
        for old, task in list(self._retiring.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await old.close()
        if self._current is not None:
            await self._current.close()


class Builds:
    """A typical turn of a random seeded organization, its query words the documents' words."""

    def __init__(
        self, clients: Rotation[ContextClient], orgs: list[Org], rng: random.Random
    ) -> None:
        self.clients, self.orgs, self.rng = clients, orgs, rng

    async def one(self, number: int, tally: Tally) -> None:
        request = request_for(self.rng.choice(self.orgs), self.rng, typical=True)
        request = request.model_copy(update={"query": " ".join(self.rng.sample(WORDS, 3))})
        brief = await self.clients.client.build(request, POLICY, timeout=BUILD_TIMEOUT_S)
        for name in brief.failed_sources:  # an optional source failed: answered, but degraded
            tally.notes[f"{name} source failed in an answered brief"] += 1


@dataclass
class Chain:
    """A memory chain of this run: who owns it, its last text, and its live revision."""

    principal: Invoker
    memory: MemoryCandidate
    head: uuid.UUID | None
    """The live revision; ``None`` once forgotten."""
    busy: bool = True
    """A call on it is in flight (or its outcome is unknown): never picked for another."""


class Memories:
    """Calls whose answers are known in advance, since one chain has one call at a time: of
    twenty, nine start a chain, seven revise one (``superseded``, or ``revived`` after a
    forget), three forget one, and one repeats a live text (refused as a ``duplicate``)."""

    def __init__(
        self, clients: Rotation[MemoryClient], orgs: list[Org], rng: random.Random
    ) -> None:
        self.clients, self.orgs, self.rng = clients, orgs, rng
        self.chains: list[Chain] = []
        self.revisions = 0

    def _idle(self, *, live: bool | None) -> Chain | None:
        for _ in range(8):  # a few random picks; a busy pool makes a new chain instead
            if not self.chains:
                return None
            chain = self.rng.choice(self.chains)
            if not chain.busy and (live is None or (chain.head is not None) == live):
                return chain
        return None

    def _text(self) -> str:
        self.revisions += 1
        words = " ".join(self.rng.sample(WORDS, 4))
        return f"Prefers {words}; noted in revision {self.revisions}."

    def _new(self) -> Chain:
        org = self.rng.choice(self.orgs)
        number = len(self.chains)
        user = org.user if self.rng.random() < 0.5 else uuid.uuid5(org.id, f"user{number % 3}")
        refs = []
        if number % 10 == 0:  # about a CRM company, which the memory source resolves
            refs = [MemorySubjectRef(kind="crm.company", id=str(self.rng.choice(org.companies)))]
        chain = Chain(
            principal=Invoker(
                organization_id=org.id,
                definition_id=uuid.uuid5(org.id, f"definition{number % 3}"),
                user_id=user,
            ),
            memory=MemoryCandidate(
                scope="user" if number % 4 == 0 else "organization",
                attribute=f"{'preference' if number % 5 == 0 else 'observation'}.soak_{number}",
                text=self._text(),
                subject_refs=refs,
            ),
            head=None,
        )
        self.chains.append(chain)
        return chain

    async def one(self, number: int, tally: Tally) -> None:
        mix = number % 20
        action, chain = "create", None
        if 9 <= mix < 16:
            action, chain = "revise", self._idle(live=None)
        elif 16 <= mix < 19:
            action, chain = "forget", self._idle(live=True)
        elif mix == 19:
            action, chain = "duplicate", self._idle(live=True)
        if chain is None:
            action, chain = "create", self._new()
        chain.busy = True
        if action == "forget":
            assert chain.head is not None
            expected = ("written", "forgotten")
            answer = await self.clients.client.forget(
                chain.principal, chain.head, timeout=MEMORY_TIMEOUT_S
            )
        else:
            if action == "revise":
                expected = ("written", "superseded" if chain.head is not None else "revived")
                chain.memory = chain.memory.model_copy(update={"text": self._text()})
            elif action == "duplicate":
                expected = ("refused", "duplicate")
            else:
                expected = ("written", "created")
            answer = await self.clients.client.remember(
                chain.principal, chain.memory, timeout=MEMORY_TIMEOUT_S
            )
        got = (answer.status, answer.change or answer.reason or "")
        if got != expected:  # the chain stays busy: its state is no longer known
            raise Unexpected(f"memory {action} answered {'/'.join(got)}: {answer.message}")
        if action == "duplicate":
            tally.notes["duplicate refused, as expected"] += 1
        elif action == "forget":
            chain.head = None
        else:
            assert answer.memory is not None
            chain.head = answer.memory.id
        chain.busy = False


@dataclass
class Document:
    organization: uuid.UUID
    uri: str
    title: str
    version: int = 0
    busy: bool = True


class Uploads:
    """Distinct markdown documents of two to four sections; one upload in four is a new version
    of an earlier document that is not in flight (a new generation of the same source)."""

    def __init__(
        self, clients: Rotation[KnowledgeClient], orgs: list[Org], rng: random.Random
    ) -> None:
        self.clients, self.orgs, self.rng = clients, orgs, rng
        self.documents: list[Document] = []

    def _markdown(self, document: Document) -> str:
        lines = [f"# {document.title}, version {document.version}", ""]
        for _ in range(self.rng.randint(2, 4)):
            lines += [f"## {' '.join(self.rng.sample(WORDS, 2)).capitalize()}", ""]
            for _ in range(self.rng.randint(1, 3)):
                sentences = [
                    " ".join(self.rng.sample(WORDS, self.rng.randint(6, 12))).capitalize() + "."
                    for _ in range(self.rng.randint(2, 5))
                ]
                lines += [" ".join(sentences), ""]
        return "\n".join(lines)

    async def one(self, number: int, tally: Tally) -> None:
        document = None
        if number % 4 == 3:
            idle = [d for d in self.documents[-200:] if not d.busy]
            document = self.rng.choice(idle) if idle else None
        if document is None:
            org = self.rng.choice(self.orgs)
            title = f"Soak note {len(self.documents)}"
            document = Document(org.id, f"soak://{org.id}/{len(self.documents)}.md", title)
            self.documents.append(document)
        else:
            tally.notes["new version of an earlier document"] += 1
        document.busy = True
        document.version += 1
        await self.clients.client.upload(
            organization_id=document.organization,
            title=document.title,
            media_type="text/markdown",
            uri=document.uri,
            content=self._markdown(document),
            timeout=UPLOAD_TIMEOUT_S,
        )
        document.busy = False  # a failed upload's document stays busy: never uploaded again


# ---------------------------------------------------------------------------- the processes


def worker_pids(parent: int) -> list[int]:
    """The extraction workers (``python -m contextcore.knowledge.adapters.worker``) ``parent``
    runs."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != parent:
                continue
            if WORKER in Path(entry.path, "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return sorted(found)


@dataclass
class Sample:
    """Each process's VmRSS (MB) at one moment, and the upload consumer's workers'."""

    at: float
    rss: dict[str, float | None]
    workers: dict[int, float]


@dataclass
class Delivery:
    """What a consumer's delivery runtime says of itself: records settled (replied, done,
    retried or dead-lettered) and dead-lettered so far, and its lag now (records of its
    partitions it has not finished)."""

    settled: float
    dead_letters: float
    lag: float

    @classmethod
    def parse(cls, text: str) -> Delivery:
        sums = dict.fromkeys(("records_total", "dead_letters_total", "lag_records"), 0.0)
        for line in text.splitlines():
            name, _, value = line.partition("{")
            for metric in sums:
                if name in (f"contextcore_consumer_{metric}", f"contextcore_{metric}"):
                    sums[metric] += float(value.rsplit(" ", 1)[1])
        return cls(sums["records_total"], sums["dead_letters_total"], sums["lag_records"])


class Fleet:
    """The soak's processes, each with its stderr in a log file of its own."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.workers_seen: set[int] = set()
        self.worker_peak_mb = 0.0
        self.exited: dict[str, int] = {}
        self.ports = {name: free_port() for name in SCRAPED}
        stack = DevStack()
        self.postgres = int((stack.pg_data / "postmaster.pid").read_text().split()[0])
        self.tansu = int(stack.broker_pid_file.read_text())

    def start(self, name: str, env: dict[str, str]) -> None:
        with (self.logs / f"{name}.log").open("wb") as log:
            if name == "sweep":  # it says "sweep ready", not "sweep consumer ready"
                process = subprocess.Popen(
                    [sys.executable, "-m", "consumers.cli", "serve", "sweep"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=log.fileno(),
                )
                assert process.stdout is not None
                self.processes[name] = process
                if not (line := process.stdout.readline()).startswith(b"sweep ready"):
                    raise RuntimeError(f"the sweep did not start: {line!r}")
            else:
                self.processes[name] = start_consumer(name, env, stderr=log.fileno())

    def sample(self, at: float) -> Sample:
        for name, process in self.processes.items():
            if process.poll() is not None and name not in self.exited:
                self.exited[name] = process.returncode
                print(f"!! the {name} process exited with {process.returncode}", flush=True)
        workers = {}
        for pid in worker_pids(self.processes["upload"].pid):
            self.workers_seen.add(pid)
            if (used := status_mb(pid, "VmRSS")) is not None:
                workers[pid] = used
            self.worker_peak_mb = max(self.worker_peak_mb, status_mb(pid, "VmHWM") or 0.0)
        rss = {name: status_mb(p.pid, "VmRSS") for name, p in self.processes.items()}
        return Sample(at, rss, workers)

    def delivery(self) -> dict[str, Delivery]:
        """Each delivery runtime's own figures, from its /metrics."""
        figures = {}
        for name, port in self.ports.items():
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as response:
                    figures[name] = Delivery.parse(response.read().decode())
            except OSError:
                figures[name] = Delivery(float("nan"), float("nan"), float("nan"))
        return figures

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: each consumer with its children, PostgreSQL (every backend, of
        every database of the stack), Tansu, and this bench."""
        used = {name: tree_cpu_seconds(p.pid) for name, p in self.processes.items()}
        used["PostgreSQL"] = tree_cpu_seconds(self.postgres)
        used["Tansu"] = tree_cpu_seconds(self.tansu)
        used["this bench"] = time.process_time()
        used["machine busy"] = machine_busy_seconds()[0]
        return used

    def stop(self) -> None:
        """SIGTERM to each, SIGKILL to any still running after ``STOP_BOUND_S``; then any
        extraction worker of ours that outlived its consumer."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_BOUND_S
        for name, process in self.processes.items():
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                print(f"the {name} process did not stop in {STOP_BOUND_S:g} s: killed")
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        for pid in self.workers_seen:
            with contextlib.suppress(OSError):
                if WORKER in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def mb(value: float | None) -> str:
    return "gone" if value is None else f"{value:.1f}"


def rss_line(label: str, sample: Sample) -> str:
    parts = []
    for name, value in sample.rss.items():
        part = f"{name} {mb(value)}"
        if name == "upload":
            workers = " + ".join(f"{v:.1f}" for v in sample.workers.values())
            part += f" (workers: {workers or 'none'})"
        parts.append(part)
    return f"{label} RSS MB  " + "  ".join(parts)


def cpu_line(label: str, before: dict[str, float], after: dict[str, float], window: float) -> str:
    parts = [f"{n} {after[n] - before[n]:.1f}" for n in after if n != "machine busy"]
    busy = after["machine busy"] - before["machine busy"]
    cores = os.cpu_count() or 1
    return (
        f"{label} CPU s   "
        + "  ".join(parts)
        + f"  (machine busy {busy:.1f} of {window * cores:.0f} core-s)"
    )


def delivery_line(label: str, before: dict[str, Delivery], after: dict[str, Delivery]) -> str:
    """What each consumer settled in the window (answered in time or not: a build whose caller
    gave up is settled all the same), its lag now, and its dead letters so far."""
    settled = "  ".join(f"{n} {after[n].settled - before[n].settled:,.0f}" for n in after)
    lag = "  ".join(f"{n} {after[n].lag:,.0f}" for n in after)
    dead = sum(figures.dead_letters for figures in after.values())
    return f"{label} settled {settled};  lag now {lag};  dead letters so far {dead:,.0f}"


# --------------------------------------------------------------------------------- the soak


class Soak:
    def __init__(
        self,
        fleet: Fleet,
        workloads: dict[str, Callable[[int, Tally], Awaitable[None]]],
        *,
        rotators: list[Callable[[float], Coroutine[Any, Any, None]]],
    ) -> None:
        self.fleet = fleet
        self.workloads = workloads
        self.rotators = rotators
        self.tallies = {kind: Tally(kind) for kind in workloads}
        self.tasks: set[asyncio.Task[None]] = set()
        self.samples: dict[str, Sample] = {}
        self.settled: dict[str, dict[str, Delivery]] = {}
        """Each consumer's delivery figures at the start and at the end of the load."""

    async def drive(self, kind: str, rate: float, start: float, duration: float) -> None:
        """Launch ``rate`` requests a second, each at its slot, never waiting for an answer."""
        if rate <= 0:
            return
        loop, tally, call = asyncio.get_running_loop(), self.tallies[kind], self.workloads[kind]
        for number in range(int(rate * duration)):
            due = start + number / rate
            if (ahead := due - loop.time()) > 0:
                await asyncio.sleep(ahead)
            tally.late = max(tally.late, loop.time() - due)
            task = asyncio.create_task(tally.attempt(due, functools.partial(call, number, tally)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def run(self, rates: dict[str, float], duration: float, interval: float) -> float:
        """The load, reported every ``interval``; returns how long the drain took."""
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.1
        mark = min(120.0, 0.2 * duration)
        drivers = [
            asyncio.create_task(self.drive(kind, rates[kind], start, duration))
            for kind in self.workloads
        ]
        drivers += [asyncio.create_task(rotate(start + duration)) for rotate in self.rotators]
        moments = {round(k * interval, 3) for k in range(1, int(duration / interval) + 1)}
        reports = moments | {round(duration, 3)}
        cpu, delivery, last = self.fleet.cpu(), self.fleet.delivery(), 0.0
        self.settled["start"] = delivery
        for at in sorted(reports | {round(mark, 3)}):
            await asyncio.sleep(max(start + at - loop.time(), 0.0))
            sample = await asyncio.to_thread(self.fleet.sample, at)  # /proc scans: off the loop
            if at == round(mark, 3):
                self.samples["mark"] = sample
            if at == round(duration, 3):
                self.samples["end"] = sample
            if at in reports:
                label = f"[{at:5.0f} s]"
                for tally in self.tallies.values():
                    print(tally.line(label, at - last))
                print(rss_line(label, sample))
                now = await asyncio.to_thread(self.fleet.cpu)
                settled = await asyncio.to_thread(self.fleet.delivery)
                print(cpu_line(label, cpu, now, at - last))
                print(delivery_line(label, delivery, settled), flush=True)
                cpu, delivery, last = now, settled, at
                self.settled["end"] = settled
        await asyncio.gather(*drivers)
        drained = loop.time()
        if self.tasks:  # answers still due: wait them out (each has its own timeout)
            await asyncio.wait(set(self.tasks), timeout=UPLOAD_TIMEOUT_S + 10)
        drain_s = loop.time() - drained
        if any(t.window for t in self.tallies.values()):
            for tally in self.tallies.values():
                print(tally.line("[drain  ]", drain_s))
        return drain_s


def summary(soak: Soak, duration: float, drain_s: float) -> None:
    fleet, mark, end = soak.fleet, soak.samples["mark"], soak.samples["end"]
    print(f"== summary: {duration:g} s of load, then {drain_s:.1f} s for the last answers")
    for tally in soak.tallies.values():
        print(
            f"{tally.kind:<7} sent {tally.sent:>7,}  answered {len(tally.latencies):>7,}  "
            f"errors {sum(tally.errors.values()):>4}  p50 {ms(percentile(tally.latencies, 0.5))}  "
            f"p99 {ms(percentile(tally.latencies, 0.99))}  (whole run)"
        )
    first, last = soak.settled["start"], soak.settled["end"]
    print(
        "settled by the consumers during the load (replies nobody waited for included): "
        + ", ".join(f"{n} {last[n].settled - first[n].settled:,.0f}" for n in last)
        + f"; dead letters {sum(d.dead_letters for d in last.values()):,.0f}"
    )
    errors = [
        (t.kind, c, n, t.examples[c]) for t in soak.tallies.values() for c, n in t.errors.items()
    ]
    print("errors: none" if not errors else "errors by cause (first example):")
    for kind, cause, count, example in errors:
        print(f"  {kind} {cause}: {count} ({example})")
    for tally in soak.tallies.values():
        for note, count in tally.notes.most_common():
            print(f"note: {tally.kind}: {note}: {count:,}")
    print(
        f"RSS at {mark.at:g} s and at the end ({end.at:g} s), growth (target under "
        f"{GROWTH_TARGET:.0%}); peak (VmHWM):"
    )
    for name, process in fleet.processes.items():
        before, after = mark.rss[name], end.rss[name]
        growth = "n/a"
        if before and after is not None:
            change = (after - before) / before
            growth = f"{change:+6.1%} ({'met' if change < GROWTH_TARGET else 'NOT met'})"
        peak = status_mb(process.pid, "VmHWM")
        target = PEAK_TARGET_MB.get(name)
        verdict = "no target"
        if target is not None and peak is not None:
            verdict = f"target under {target:,.0f} MB: {'met' if peak < target else 'NOT met'}"
        print(
            f"  {name:<7} {mb(before):>7} -> {mb(after):>7} MB  {growth:<18}  "
            f"peak {mb(peak):>7} MB ({verdict})"
        )
    print(
        f"  upload's extraction workers: {len(mark.workers)} at {mark.at:g} s "
        f"({sum(mark.workers.values()):.1f} MB), {len(end.workers)} at the end "
        f"({sum(end.workers.values()):.1f} MB); {len(fleet.workers_seen)} seen in all, "
        f"the largest peak seen {fleet.worker_peak_mb:.1f} MB"
    )


async def database_line(admin_url: str) -> str:
    admin = await asyncpg.connect(admin_url)
    try:
        row = await admin.fetchrow(
            "SELECT (SELECT count(*) FROM memories) AS revisions,"
            " (SELECT count(*) FROM live_memories) AS live,"
            " (SELECT count(*) FROM knowledge_sources) AS sources,"
            " (SELECT count(*) FROM knowledge_chunks) AS chunks,"
            " (SELECT count(*) FROM processed_messages) AS ledger,"
            " (SELECT count(*) FROM delivery_starts) AS journal,"
            " pg_database_size(current_database()) AS bytes"
        )
    finally:
        await admin.close()
    assert row is not None
    return (
        f"database {DATABASE}: {row['revisions']:,} memory revisions ({row['live']:,} live), "
        f"{row['sources']:,} knowledge sources, {row['chunks']:,} chunks, {row['ledger']:,} "
        f"ledger claims, {row['journal']:,} start-journal rows, {row['bytes'] / 1e6:,.0f} MB"
    )


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(line for line in info if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown (no /proc/cpuinfo)"
    return ", ".join(
        f"{flag} {'present' if flag in flags else 'absent'}" for flag in ("amx_bf16", "avx512_bf16")
    )


def environment(
    bootstrap: str, url: str, topics: TopicSettings, tag: str, ports: dict[str, int]
) -> dict[str, str]:
    """One environment for the five processes (each reads its own prefix)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")}
    env |= {
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        # builds are latency-bound: the dev stack's poll (bench.e2e's)
        "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": str(TANSU_FETCH_MAX_WAIT_MS),
        # bench.memory's: Tansu starves a lagging consumer whose poll is short (docs/delivery.md)
        "CONTEXTCORE_MEMORY_FETCH_MAX_WAIT_MS": "50",
        "CONTEXTCORE_DATABASE_URL": url,
        "CONTEXTCORE_TOPIC_BUILD_REQUEST": topics.build_request,
        "CONTEXTCORE_TOPIC_MEMORY_WRITE": topics.memory_write,
        "CONTEXTCORE_TOPIC_UPLOAD": topics.upload,
        "CONTEXTCORE_TOPIC_EMBED": topics.embed,
        # the clients' reply topics are under the soak's prefix: every process's reply-topic
        # rule must say so, or none answers them (broker/reply_topics.py)
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
    }
    for consumer in ("BUILD", "MEMORY", "UPLOAD", "EMBED"):
        env[f"CONTEXTCORE_{consumer}_GROUP_ID"] = f"bench-{tag}-{consumer.lower()}"
    for consumer in CONSUMERS:
        port = ports.get(consumer, 0)
        env[f"CONTEXTCORE_{consumer.upper()}_METRICS_PORT"] = str(port)
    return env


SMOKE = {
    "duration": 8.0,
    "interval": 4.0,
    "build_rate": 4.0,
    "memory_rate": 4.0,
    "upload_rate": 0.25,
    "organizations": 1,
    "rotate_s": 4.0,
}
"""``--smoke``: the sizes of a smoke run."""


async def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between reports")
    parser.add_argument("--build-rate", type=float, default=40.0, help="builds per second")
    parser.add_argument("--memory-rate", type=float, default=40.0, help="memory writes per second")
    parser.add_argument("--upload-rate", type=float, default=0.5, help="uploads per second")
    parser.add_argument("--organizations", type=int, default=5, help="seeded organizations")
    parser.add_argument(
        "--rotate-s",
        type=float,
        default=30.0,
        help="give the build and memory clients a new reply topic this often (0: never): "
        "on Tansu a reply partition's growing log costs the broker more CPU per record",
    )
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    database = database_name(DATABASE, args.smoke)
    rates = {"build": args.build_rate, "memory": args.memory_rate, "upload": args.upload_rate}
    load = ", ".join(f"{kind} {rate:g}/s" for kind, rate in rates.items())
    renewed = f"every {args.rotate_s:g} s" if args.rotate_s > 0 else "never"
    print(
        f"soak: {args.duration:g} s of {load}, a report every {args.interval:g} s, new reply "
        f"topics for the build and memory clients {renewed}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; "
        f"CPU flags: {cpu_flags()}",
        flush=True,
    )
    seeded = await prepare(database, args.organizations)
    bootstrap = seeded.stack.bootstrap_servers
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        build_request=f"bench.{tag}.build-request",
        memory_write=f"bench.{tag}.memory-write",
        upload=f"bench.{tag}.upload",
        embed=f"bench.{tag}.embed",
        reply_prefix=f"bench.{tag}.reply",
    )
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="contextcore-soak-")))
    rotations: list[Rotation[Any]] = []
    try:
        await ensure_topics(bootstrap, all_topics(topics))
        env = environment(bootstrap, seeded.url, topics, tag, fleet.ports)
        for name in CONSUMERS:  # one by one: the build consumer exports the model if needed
            started = time.perf_counter()
            fleet.start(name, env)
            rss = status_mb(fleet.processes[name].pid, "VmRSS")
            print(f"{name} ready in {time.perf_counter() - started:.1f} s, RSS {mb(rss)} MB")
        rng = random.Random(args.seed)
        async with contextlib.AsyncExitStack() as clients:

            def channel(fetch_max_wait_ms: int) -> ChannelOptions:
                return ChannelOptions(
                    bootstrap_servers=bootstrap,
                    reply_topic_prefix=topics.reply_prefix,
                    fetch_max_wait_ms=fetch_max_wait_ms,
                )

            # builds wait on the dev stack's poll (bench.e2e's), memory answers on
            # bench.memory's 20 ms, upload statuses on bench.ingest's 100 ms
            build = Rotation(
                lambda: ContextClient(
                    request_topic=topics.build_request, **channel(TANSU_FETCH_MAX_WAIT_MS)
                ),
                every_s=args.rotate_s,
            )
            memory = Rotation(
                lambda: MemoryClient(memory_topic=topics.memory_write, **channel(20)),
                every_s=args.rotate_s,
            )
            knowledge = Rotation(  # a few statuses a second: its reply topic stays short
                lambda: KnowledgeClient(upload_topic=topics.upload, **channel(100)),
                every_s=0,
            )
            rotations += [build, memory, knowledge]
            for rotation in rotations:
                await rotation.start()
                clients.push_async_callback(rotation.close)
            soak = Soak(
                fleet,
                {
                    "build": Builds(build, seeded.orgs, rng).one,
                    "memory": Memories(memory, seeded.orgs, rng).one,
                    "upload": Uploads(knowledge, seeded.orgs, rng).one,
                },
                rotators=[build.run, memory.run],
            )
            drain_s = await soak.run(rates, args.duration, args.interval)
        summary(soak, args.duration, drain_s)
        print(await database_line(seeded.admin_url))
        silent = [kind for kind, tally in soak.tallies.items() if not tally.latencies]
        if args.smoke and silent:
            raise SystemExit(f"smoke: no {', '.join(silent)} call answered")
    finally:
        fleet.stop()
        logged = []
        for name in fleet.processes:
            text = (fleet.logs / f"{name}.log").read_text(errors="replace")
            flagged = sum(
                1 for line in text.splitlines() if " WARNING " in line or " ERROR " in line
            )
            logged.append(f"{name} {flagged}")
        print(f"consumer logs in {fleet.logs}, warning/error lines: {', '.join(logged)}")
        await delete_topics(bootstrap, [spec.name for spec in all_topics(topics)])
        await delete_topics(bootstrap, [t for r in rotations for t in r.reply_topics])
        await drop(seeded.stack, database)


if __name__ == "__main__":
    asyncio.run(main())
