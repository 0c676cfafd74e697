"""Elastic groups (issue 34): under steady mixed load, each consumer group grows and shrinks as
an autoscaler makes it (KEDA in k8s/): 1 -> 2 -> 3 processes by start, one ``kill -9`` of the
third (started again at once, as its Deployment would), then back to 1 by SIGTERM. Then the truth
from PostgreSQL and the topics: every build request answered, every memory write answered
``written`` and stored once, every upload ``ready`` with its chunks stored once, nothing
dead-lettered (tests/integration/load.py, as the chaos test reads it)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from tests.integration.helpers import free_port, logs_tail
from tests.integration.load import ORG, MixedLoad, follow_load
from tests.integration.test_crash_loop import Reader
from tests.services import Config, spawn_build_consumer

pytestmark = pytest.mark.integration

CONSUMERS = ("build", "memory", "upload", "embed")
STEP_S = 10.0
"""Between two changes of the groups: a join or a leave takes 3-5 s on the dev broker, and a
process that joins should take partitions over before the next change (at 6 s the third
process of each group never got any)."""


@dataclass
class Member:
    process: asyncio.subprocess.Process
    port: int
    settled: float = 0.0
    """Records it settled, as its /metrics said last (read before it leaves)."""

    async def read_settled(self) -> None:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with contextlib.suppress(OSError):  # not serving yet: nothing settled
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
            self.settled = sum(
                float(line.rsplit(" ", 1)[1])
                for line in body.decode().splitlines()
                if line.startswith("contextcore_consumer_records_total{")
            )


class Groups:
    """The processes of each group, started and stopped as an autoscaler would."""

    def __init__(self, config: Config, logs: Path) -> None:
        self.config = config
        self.logs = logs
        self.members: dict[str, list[Member]] = {c: [] for c in CONSUMERS}
        self.gone: dict[str, list[Member]] = {c: [] for c in CONSUMERS}
        self.started = 0

    async def grow(self) -> None:
        """One more process in every group, each with its own metrics port."""
        for consumer in CONSUMERS:
            self.started += 1
            port = free_port()
            config = self.config.with_(consumer, metrics_port=port)
            with (self.logs / f"{consumer}-{self.started}.log").open("wb") as log:
                process = await spawn_build_consumer(config, stderr=log, consumer=consumer)
            self.members[consumer].append(Member(process, port))

    async def shrink(self, sig: signal.Signals) -> None:
        """The newest process of every group gets ``sig``; waited for (SIGTERM: it drains and
        commits first). What each settled is read just before."""
        leaving = {c: self.members[c].pop() for c in CONSUMERS}
        for consumer, member in leaving.items():
            await member.read_settled()
            self.gone[consumer].append(member)
            member.process.send_signal(sig)
        await asyncio.gather(*(member.process.wait() for member in leaving.values()))

    async def working(self, consumer: str) -> int:
        """How many of ``consumer``'s processes, gone or running, settled records."""
        for member in self.members[consumer]:
            await member.read_settled()
        return sum(m.settled > 0 for m in [*self.gone[consumer], *self.members[consumer]])

    @property
    def processes(self) -> dict[str, list[asyncio.subprocess.Process]]:
        return {c: [m.process for m in group] for c, group in self.members.items()}

    def alive(self) -> bool:
        return all(p.returncode is None for group in self.processes.values() for p in group)

    def log(self) -> str:
        return logs_tail(self.logs)

    async def stop(self) -> None:
        for group in self.processes.values():
            for process in group:
                if process.returncode is None:
                    process.send_signal(signal.SIGKILL)
                await process.wait()


@pytest.mark.timeout(600)
async def test_groups_grow_and_shrink_under_load_and_nothing_is_lost_or_doubled(
    config: Config, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'Elastic')", ORG)
    # twelve processes at the peak share the suite's PostgreSQL with the other workers' tests:
    # small pools (the load is light), or the server runs out of connections (CI did)
    config = config.with_("database", pool_size=3)
    reader = Reader()
    reply_to, letters = await follow_load(config, reader, "elastic")
    groups = Groups(config, tmp_path)
    await groups.grow()
    load = MixedLoad(config, reply_to, per_tick=1, chains=8, upload_every=20)
    replies = reader.records[reply_to]
    changed = asyncio.Event()

    async def autoscale() -> None:
        try:
            for change in ("grow", "grow", "kill", "term", "term"):
                await asyncio.sleep(STEP_S)
                assert groups.alive(), groups.log()
                if change == "grow":
                    await groups.grow()
                elif change == "kill":  # the third dies, and its Deployment starts another
                    await groups.shrink(signal.SIGKILL)
                    await groups.grow()
                else:
                    await groups.shrink(signal.SIGTERM)
            await asyncio.sleep(STEP_S)
        finally:
            changed.set()

    try:
        await asyncio.gather(load.run(changed.is_set), autoscale())
        assert all(len(group) == 1 for group in groups.processes.values())
        async with asyncio.timeout(300):
            while not load.answered(replies):
                assert groups.alive(), groups.log()
                await asyncio.sleep(0.5)
        # the groups really spread the work: more than one process of each settled records
        working = {consumer: await groups.working(consumer) for consumer in CONSUMERS}
        assert all(count >= 2 for count in working.values()), working
    finally:
        await groups.stop()
        await reader.close()

    print(
        f"elastic: {groups.started} processes started, {working} settled records; "
        f"{len(load.builds)} builds, "
        f"{len(load.writes)} memory writes, {len(load.uploads)} uploads"
    )
    await load.assert_settled_truth(admin, replies)
    for topic in letters:
        assert not reader.records[topic], (topic, reader.records[topic][:3])
