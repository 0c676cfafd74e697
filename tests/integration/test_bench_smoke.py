"""Every bench runs (issue 36, item 6): each ``bench/*.py`` with a ``__main__``, as
``python -m bench.X --smoke``, in its own process, against this session's services. A smoke run
takes every phase of its bench end to end at tiny sizes and prints its figures; it exits non-zero
when it breaks. The figures mean nothing at those sizes: each test asserts the exit status and
that the lines of the bench's last phases were printed, never a figure or a time.

The benches run on the embedded dev stack (``bench.seeded.prepare``: ``DevStack().up``), each
on a database of its own (``bench.seeded.database_name``) and topics and groups of its own, so
these tests share the stack as the others do. Against services of one's own that are not the
dev stack they are skipped, saying so. Three needs are met here or said in the skip:

* the documentation sets (``bench.corpora``: Debian packages fetched once with ``apt-get
  download`` into ``~/.cache/contextcore-bench``) for the knowledge benches;
* the dev stack's hot standby for ``bench.read_after``: started as test_replica.py starts it
  when this run owns the stack; on a stack already up it must run already;
* one bench at a time pausing the standby's replay (``standby-replay.lock``, test_replica.py's).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from broker.settings import TopicSettings
from broker.topics import all_topics
from devstack.stack import DevStack
from tests.services import Services, _exclusive

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

BENCHES: dict[str, tuple[str, ...]] = {
    # bench: lines it always prints, from its last phases (substrings of its output)
    "bombs": ("100 KB of unclosed tags", "4 pages inflating to 80 MB"),
    "broker_tail": ("1,000 records before:",),
    "contention": ("one thread, free (the query encoder's)",),
    "e2e": ("max sustainable (p99 <= 100 ms), 2 process(es)", "== this code: each workload"),
    "failover": ("unanswered after kill -9: median",),
    "fairness": ("[erasure]", "[ingestion]", "[builds]", "[interactive]", "its source as stored"),
    "ingest": ("pipeline: 2/2 ready", "pipeline / raw sentence-transformers, torch fp32"),
    "knowledge_build": ("knowledge builds over", "build consumer peak RSS"),
    "memory": ("remember end to end, 16 producers", "memory source, a front-door turn", "erase"),
    "packer": ("builder, 10 instant sources x 10 items",),
    "poison_memory": ("encode-2x65536",),
    "quality": ("held-out", "against the baseline: R@10"),
    "read_after": ("a position the standby has not replayed:",),
    "scale": ("3 build processes:", "one is killed", "peak RSS of the build processes"),
    "search": ("large (HNSW)", "small (exact)"),
    "soak": ("== summary:", "errors"),
    "sources": ("whole build (5)", "peak RSS of this process"),
}
"""Every runnable bench, and what its smoke run prints once its last phase ran."""

CORPUS = {"contention", "fairness", "ingest", "knowledge_build", "quality", "search"}
"""The benches that read the documentation sets (bench/corpora.py)."""

STANDBY = {"read_after"}


def _not_the_dev_stack(services: Services) -> str | None:
    """Why the benches cannot run on ``services``, or ``None``: they use the dev stack."""
    stack = DevStack()
    if not all(stack.status()):
        return "the benches run on the embedded dev stack (bench.seeded), which does not run"
    ours = stack.addresses
    if ours.bootstrap_servers != services.bootstrap_servers or (
        urlsplit(ours.admin_url).port != urlsplit(services.admin_url).port
    ):
        return (
            "the benches run on the embedded dev stack (bench.seeded), and this session's "
            f"services ({services.bootstrap_servers}) are others"
        )
    return None


@pytest.fixture(scope="session")
async def corpus() -> str | None:
    """Why the documentation sets are missing (fetched once here, under a lock), or ``None``."""
    from bench.corpora import fetch

    async with _exclusive(Path(tempfile.gettempdir()) / "contextcore-bench-corpus.lock"):
        try:
            await asyncio.to_thread(fetch)
        except (OSError, subprocess.CalledProcessError) as error:
            return f"the documentation sets (bench/corpora.py) could not be fetched: {error}"
    return None


async def _standby(services: Services) -> str | None:
    """The dev stack's standby running (started when this run owns the stack, as
    test_replica.py does), or why not."""
    own = ("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS", "CONTEXTCORE_DATABASE_ADMIN_URL")
    stack = DevStack()
    if all(os.environ.get(name) for name in own):  # services of one's own: never started here
        if await asyncio.to_thread(stack.replica.running):
            return None
        return (
            "bench.read_after needs the dev stack's hot standby, which does not run, and this "
            "session's services are its own (start it: contextcore dev up --replica)"
        )
    async with _exclusive(stack.home / "pytest.lock"):
        await stack.up(all_topics(TopicSettings()), replica=True)
    return None


@pytest.fixture
async def needs(
    request: pytest.FixtureRequest, services: Services, corpus: str | None
) -> AsyncIterator[None]:
    """What the bench of this test needs, met, or the test skipped with the reason; held
    while it runs (the standby's replay lock)."""
    bench = request.node.callspec.params["bench"]
    reason = _not_the_dev_stack(services)
    if reason is None and bench in CORPUS:
        reason = corpus
    if reason is None and bench in STANDBY:
        reason = await _standby(services)
    if reason is not None:
        pytest.skip(reason)
    async with AsyncExitStack() as held:
        if bench in STANDBY:  # it pauses the standby's replay, which test_replica.py's use
            await held.enter_async_context(_exclusive(DevStack().home / "standby-replay.lock"))
        yield


@pytest.mark.timeout(600)
@pytest.mark.parametrize("bench", sorted(BENCHES))
async def test_the_bench_runs_its_smoke(bench: str, needs: None, tmp_path: Path) -> None:
    output = tmp_path / f"{bench}.log"
    with output.open("wb") as log:  # a file, not a pipe: a bench's output can be long
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", f"bench.{bench}", "--smoke"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=570,
            check=False,
        )
    printed = output.read_text(errors="replace")
    assert done.returncode == 0, (
        f"bench.{bench} --smoke exited {done.returncode}:\n{printed[-6000:]}"
    )
    missing = [line for line in BENCHES[bench] if line not in printed]
    assert not missing, f"bench.{bench} --smoke did not print {missing}:\n{printed[-6000:]}"


def test_every_runnable_bench_has_a_smoke_test() -> None:
    runnable = {
        path.stem
        for path in (ROOT / "bench").glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }
    assert runnable == set(BENCHES)
