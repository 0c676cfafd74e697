"""The extraction sandbox with real worker processes: each bound fails its job with the reason,
the next job gets a working worker, a cancelled job leaves no process behind, and a worker sees
no credential and cannot make the consumer accept nonsense."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.sandbox import SandboxLimits, TextSandbox
from contextcore.knowledge.chunk import ChunkSettings, ModelWindow, WordPieceTokenizer, chunk
from contextcore.knowledge.extract import ExtractionError, Limits, extract
from tests.documents import bomb_pdf, flat_tags_html, nesting_bomb_html, shared_stream_pdf
from tests.integration.helpers import until

pytestmark = pytest.mark.integration

MODEL = "m"
WINDOWS = {MODEL: ModelWindow(default_model_path(DEFAULT_MODEL), ChunkSettings())}
GUIDE = b"# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n## Use\n\n" + b"Go on. " * 400


def fake_worker(body: str) -> list[str]:
    """A stand-in worker: ``body`` runs after the job's two frames are read (``job`` holds the
    job's JSON), with ``answer(bytes)`` to write one frame."""
    program = (
        "import json, os, signal, struct, sys, time\n"
        "def frame():\n"
        "    (n,) = struct.unpack('>Q', sys.stdin.buffer.read(8))\n"
        "    return sys.stdin.buffer.read(n)\n"
        "def answer(b):\n"
        "    sys.stdout.buffer.write(struct.pack('>Q', len(b)) + b); sys.stdout.buffer.flush()\n"
        "job = json.loads(frame()); document = frame()\n" + body
    )
    return [sys.executable, "-c", program]


async def test_a_document_cuts_as_it_does_in_process() -> None:
    sandbox = TextSandbox(workers=1)
    try:
        cut = await sandbox.cut(
            title="Guide", models=WINDOWS, media_type="text/markdown", document=GUIDE
        )
        again = await sandbox.cut(title="Guide", models=WINDOWS, sections=cut.sections)
    finally:
        await sandbox.close()
    sections = extract(GUIDE, "text/markdown")
    tokenizer = WordPieceTokenizer(default_model_path(DEFAULT_MODEL))
    assert cut.sections == sections
    assert cut.chunks[MODEL] == chunk("Guide", sections, tokenizer, ChunkSettings())
    assert again.chunks == cut.chunks


async def test_a_document_beside_a_long_one_finds_a_worker_already_started() -> None:
    """Issue 33: once a job starts, a spare worker starts too (up to ``workers``), so the next
    document, arriving while the first is being cut, takes a process that had started before
    it arrived instead of waiting for one to start."""
    sandbox = TextSandbox(workers=2, command=fake_worker(
        "time.sleep(job['title'] == 'long' and 600 or 0)\n"
        "answer(json.dumps({'pid': os.getpid()}).encode())\n"
    ))  # fmt: skip
    try:
        long = asyncio.create_task(sandbox.cut(title="long", models={}, document=b"x"))
        await until(lambda: len(sandbox._busy) == 1 and len(sandbox._idle) == 1)
        [spare] = sandbox._idle
        started_before = spare.process.pid
        with pytest.raises(ExtractionError):  # the fake answers no cut: nonsense, as it must
            await sandbox.cut(title="short", models={}, document=b"x")
        assert [w.process.pid for w in sandbox._busy] != [started_before]  # the long one
        assert spare.jobs == 1  # the short document ran on the spare
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
    finally:
        await sandbox.close()


async def test_no_more_workers_live_than_the_sandbox_allows() -> None:
    """Jobs at once on a fresh sandbox, with spares starting meanwhile: never more than
    ``workers`` processes alive, and as many kept warm after."""
    sandbox = TextSandbox(workers=2)
    try:
        for _ in range(3):
            jobs = [
                sandbox.cut(
                    title="Guide", models=WINDOWS, media_type="text/markdown", document=GUIDE
                )
                for _ in range(4)
            ]
            assert len(await asyncio.gather(*jobs)) == 4
        await until(lambda: not sandbox._spares)
        live = [w for w in sandbox._idle if w.process.returncode is None]
        assert len(live) == 2
    finally:
        await sandbox.close()


async def test_memory_and_cpu_bounds_fail_the_job_and_the_next_one_works() -> None:
    sandbox = TextSandbox(workers=1, limits=SandboxLimits(memory_mb=160, cpu_s=1, wall_s=30))
    try:
        with pytest.raises(ExtractionError, match="extraction exceeded 160 MB of memory"):
            await sandbox.cut(  # pypdf's own inflate limit lifted: the address space stops it
                title="Bomb",
                models=WINDOWS,
                media_type="application/pdf",
                document=bomb_pdf(),
                limits=Limits(max_stream_bytes=1_000_000_000),
            )
        with pytest.raises(ExtractionError, match="extraction exceeded 1 s of CPU time"):
            await sandbox.cut(
                title="Tags",
                models=WINDOWS,
                media_type="text/html",
                document=flat_tags_html(8_000_000),
            )
        cut = await sandbox.cut(
            title="Guide", models=WINDOWS, media_type="text/markdown", document=GUIDE
        )
        assert cut.chunks[MODEL]
    finally:
        await sandbox.close()


async def test_bombs_that_were_quadratic_finish_inside_a_small_cpu_bound() -> None:
    """20,000 nested paragraphs took 383 s and a 2,000-page PDF sharing one stream 217 s with
    the tree-walking readers; 5 s of CPU holds both now (bench/bombs.py has the figures)."""
    sandbox = TextSandbox(workers=2, limits=SandboxLimits(cpu_s=5, wall_s=60))
    try:
        nested, shared = await asyncio.gather(
            sandbox.cut(
                title="Nested",
                models=WINDOWS,
                media_type="text/html",
                document=nesting_bomb_html(20_000),
            ),
            sandbox.cut(
                title="Shared",
                models=WINDOWS,
                media_type="application/pdf",
                document=shared_stream_pdf(2_000, text_lines=1),
            ),
        )
    finally:
        await sandbox.close()
    assert sum(len(s.paragraphs) for s in nested.sections) == 20_000
    assert len(shared.sections) == 2_000


async def test_the_wall_bound_stops_a_worker_that_never_answers() -> None:
    sandbox = TextSandbox(
        workers=1,
        limits=SandboxLimits(cpu_s=0.5, wall_s=1),
        command=fake_worker("time.sleep(600)"),
    )
    try:
        with pytest.raises(ExtractionError, match=r"extraction exceeded 1 s \(wall time\)"):
            await sandbox.cut(title="T", models=WINDOWS, media_type="text/plain", document=b"x")
    finally:
        await sandbox.close()


async def test_a_cancelled_job_kills_its_worker() -> None:
    sandbox = TextSandbox(workers=1, command=fake_worker("time.sleep(600)"))
    job = asyncio.create_task(
        sandbox.cut(title="T", models=WINDOWS, media_type="text/plain", document=b"x")
    )
    try:
        await until(lambda: sandbox._busy)
        (worker,) = sandbox._busy
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        assert worker.process.returncode == -signal.SIGKILL  # killed and reaped
    finally:
        await sandbox.close()


TOKENIZE_WHOLE = (
    "import resource\n"
    "from tokenizers import Tokenizer\n"
    "cap = int(sys.argv[sys.argv.index('--memory-bytes') + 1])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
    "tokenizer = Tokenizer.from_file(job['models']['m']['tokenizer'] + '/tokenizer.json')\n"
    "tokenizer.encode(document.decode(), add_special_tokens=False)\n"
)
"""The worker as it was: the whole text tokenized at once, under the worker's address-space cap
(the real tokenizer aborts the process when an allocation fails)."""


async def test_a_native_allocation_failure_is_reported_as_the_memory_limit() -> None:
    """Out of memory in native code aborts (SIGABRT) instead of raising: 8 MB of ``<p>x</p>``
    was answered "the extraction process crashed (SIGABRT)". What the worker printed as it died
    says which limit it hit."""
    sandbox = TextSandbox(
        workers=1, limits=SandboxLimits(memory_mb=256), command=fake_worker(TOKENIZE_WHOLE)
    )
    try:
        with pytest.raises(ExtractionError) as failed:
            await sandbox.cut(
                title="X", models=WINDOWS, media_type="text/plain", document=b"x " * 1_000_000
            )
    finally:
        await sandbox.close()
    assert str(failed.value) == "extraction exceeded 256 MB of memory"


@pytest.mark.parametrize(
    "document",
    [b"<b>x</b>" * 1_000_000, b"<p>x</p>" * 1_000_000],
    ids=["8 MB of <b>x</b>", "8 MB of <p>x</p>"],
)
async def test_the_worker_tokenizes_a_huge_text_within_its_memory(document: bytes) -> None:
    """The documents that aborted the tokenizer (above) now cut into chunks under the default
    512 MB: the text is tokenized a segment at a time."""
    sandbox = TextSandbox(workers=1, limits=SandboxLimits(cpu_s=120, wall_s=240))
    try:
        cut = await sandbox.cut(
            title="X", models=WINDOWS, media_type="text/html", document=document
        )
    finally:
        await sandbox.close()
    window = WINDOWS[MODEL].settings
    assert cut.chunks[MODEL]
    assert all(len(c.text) <= window.max_chars for c in cut.chunks[MODEL])


@pytest.mark.parametrize(
    ("body", "limits", "reason"),
    [
        ("os.kill(os.getpid(), signal.SIGSEGV)", SandboxLimits(), r"crashed \(SIGSEGV\)"),
        ("os.abort()", SandboxLimits(), r"crashed \(SIGABRT\)"),
        ("sys.exit(3)", SandboxLimits(), "exit status 3"),
        ('answer(b\'{"ok": true, "sections": 5}\')', SandboxLimits(), "answered nonsense"),
        (
            "answer(json.dumps({'ok': True, 'sections': [], 'parts': [], 'headings': [''], "
            "'chunks': {'m': [[0, 0, 'x', 99999]]}}).encode())",  # well formed, tokens a lie
            SandboxLimits(),
            "answered nonsense",
        ),
        (
            "sys.stdout.buffer.write(struct.pack('>Q', 2 * 1024 * 1024)); sys.stdout.flush()",
            SandboxLimits(output_mb=1),
            "extraction output exceeded 1 MB",
        ),
    ],
)
async def test_a_worker_that_dies_or_lies_fails_only_its_job(
    body: str, limits: SandboxLimits, reason: str
) -> None:
    sandbox = TextSandbox(workers=1, limits=limits, command=fake_worker(body))
    try:
        with pytest.raises(ExtractionError, match=reason):
            await sandbox.cut(title="T", models=WINDOWS, media_type="text/plain", document=b"x")
    finally:
        await sandbox.close()


async def test_a_worker_sees_no_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTCORE_DATABASE_URL", "postgresql://runtime:secret@db/contextcore")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    sandbox = TextSandbox(
        workers=1,
        command=fake_worker(
            "answer(json.dumps({'ok': False, 'reason': json.dumps(sorted(os.environ))}).encode())"
        ),
    )
    try:
        with pytest.raises(ExtractionError) as refused:
            await sandbox.cut(title="T", models=WINDOWS, media_type="text/plain", document=b"x")
    finally:
        await sandbox.close()
    names = json.loads(str(refused.value))
    assert "PATH" in names
    assert not [n for n in names if n.startswith(("CONTEXTCORE_", "AWS_"))]


PARENT = """
import asyncio, sys
from contextcore.knowledge.chunk import ChunkSettings
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.chunk import ModelWindow
from contextcore.knowledge.adapters.sandbox import TextSandbox
from tests.documents import flat_tags_html

async def main():
    sandbox = TextSandbox(workers=1)
    windows = {"m": ModelWindow(default_model_path(DEFAULT_MODEL), ChunkSettings())}
    job = asyncio.create_task(sandbox.cut(
        title="T", models=windows, media_type="text/html", document=flat_tags_html(19_000_000)))
    while not sandbox._busy:
        await asyncio.sleep(0.01)
    (worker,) = sandbox._busy
    print(worker.process.pid, flush=True)
    await job

asyncio.run(main())
"""


async def test_a_worker_dies_with_its_consumer() -> None:
    """A consumer killed mid-job (kill -9, the OOM killer) leaves no parse running."""
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, stdout=asyncio.subprocess.PIPE
    )
    assert parent.stdout is not None
    worker = int(await asyncio.wait_for(parent.stdout.readline(), 60))
    await until(lambda: _cpu_s(worker) > 1.0)  # parsing 19 MB of tags: about 15 s of CPU
    parent.kill()
    await parent.wait()
    spent: list[float] = []

    def gone() -> bool:
        spent.append(_cpu_s(worker))
        return not _alive(worker)

    await until(gone, timeout=120)
    assert max(spent) < 8.0, "the worker went on parsing for its dead consumer"


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie no parent reaps is dead too
