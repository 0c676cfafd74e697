"""The benches' consumer processes, and what a process cost: its peak RSS, and the CPU seconds
of it and everything it started.

Read from ``/proc`` (Linux), so the benches need nothing beyond the standard library to say
where a run's CPU went.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def start_consumer(
    consumer: str,
    env: dict[str, str],
    *,
    stderr: int = subprocess.DEVNULL,
    cores: set[int] | None = None,
) -> subprocess.Popen[bytes]:
    """``contextcore serve <consumer>`` in its own process, once it says it is ready; on
    ``cores`` only, if given, from its first instruction (a thread pool sized at start-up, as
    OpenVINO's is, then sees those cores alone)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "consumers.cli", "serve", consumer],
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        preexec_fn=None if cores is None else functools.partial(os.sched_setaffinity, 0, cores),
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(f"{consumer} consumer ready".encode()):
        raise RuntimeError(f"the {consumer} consumer did not start: {line!r}")
    return process


def status_mb(pid: int, key: str) -> float | None:
    """A ``/proc/<pid>/status`` figure in MB (``VmRSS``, ``VmHWM``); ``None`` once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb(pid: int) -> float:
    """The process's high-water resident set (VmHWM), in MB."""
    peak = status_mb(pid, "VmHWM")
    return float("nan") if peak is None else peak


def nice(pid: int) -> int | None:
    """The process's nice value (``/proc/<pid>/stat``, field 19); ``None`` once it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[16])


def priority(pid: int) -> str:
    """The process's nice value and, when not the normal one, its scheduling policy."""
    policies = {getattr(os, name, -1): name for name in ("SCHED_IDLE", "SCHED_BATCH")}
    try:
        policy = policies.get(os.sched_getscheduler(pid), "")
    except OSError:
        policy = ""
    return f"nice {nice(pid)}" + (f", {policy}" if policy else "")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the name may hold spaces; fields from 3 on


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants, ``pid`` first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        current = pending.pop(0)
        found.append(current)
        pending.extend(children.get(current, []))
    return found


def tree_cpu_seconds(pid: int, *, descendants: bool = True) -> float:
    """User + system CPU of ``pid``, its reaped children and its live descendants (or, without
    ``descendants``, of ``pid`` alone).

    A child counts once: live, by its own times; after its parent reaps it, in the parent's
    ``cutime``/``cstime`` (what PostgreSQL's exited backends leave behind).
    """
    if not descendants:
        fields = _stat(pid)
        return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICKS
    total = 0.0
    for current in tree(pid):
        fields = _stat(current)
        if fields is None:
            continue
        utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
        total += utime + stime + (cutime + cstime if current == pid else 0)
    return total / TICKS


def runqueue_wait_seconds(pid: int, *, descendants: bool = True) -> float:
    """Seconds the live threads of ``pid`` and of its live descendants (or of ``pid`` alone)
    have spent runnable but waiting for a core (``/proc/<pid>/task/<tid>/schedstat``, its
    second field): what the CPU contention of a run cost a process, beside the CPU it used. A
    thread that has ended takes its figure with it, so compare long-lived processes."""
    total = 0
    for process in tree(pid) if descendants else [pid]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in os.scandir(f"/proc/{process}/task"):
                with contextlib.suppress(OSError):
                    total += int(Path(task.path, "schedstat").read_text().split()[1])
    return total / 1e9


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and of its live descendants onto ``cores``; what they start
    later inherits it (a PostgreSQL backend forks from the pinned postmaster)."""
    for process in tree(pid):
        with contextlib.suppress(FileNotFoundError):  # gone meanwhile
            tasks = os.listdir(f"/proc/{process}/task")
            for task in tasks:
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(task), cores)


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, summed over its cores."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS, sum(fields[:8]) / TICKS


def busy_since(start: tuple[float, float]) -> float:
    """The share of the machine's cores busy since ``start`` (``machine_busy_seconds()``)."""
    busy, whole = machine_busy_seconds()
    return (busy - start[0]) / max(1e-9, whole - start[1])


def _burn(share: float, stop: Event) -> None:
    """Keep ``share`` of one core busy (of each 10 ms, ``share`` spinning and the rest asleep)
    until ``stop``."""
    period = 0.01
    while not stop.is_set():
        began = time.perf_counter()
        while time.perf_counter() - began < share * period:
            pass
        time.sleep(max(0.0, period - (time.perf_counter() - began)))


@contextlib.contextmanager
def burning(cores: float) -> Iterator[None]:
    """Processes of normal priority that keep ``cores`` cores' worth of CPU busy while the
    block runs, and want nothing else of the machine: a neighbour that takes the CPU a flood
    took, without the flood's requests."""
    count = math.ceil(cores) if cores > 0 else 0
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    burners = [context.Process(target=_burn, args=(cores / count, stop)) for _ in range(count)]
    for burner in burners:
        burner.start()
    try:
        yield
    finally:
        stop.set()
        for burner in burners:
            burner.join()
