"""Extraction and chunking out of process: a small pool of
:mod:`~contextcore.knowledge.adapters.worker` processes, each bounded, killed and replaced when it
passes a bound.

The bounds (:class:`SandboxLimits`) and what passing each one answers, as the failed source's
reason that the uploader hears:

* memory: the worker's address space; ``extraction exceeded 512 MB of memory``;
* CPU time: per job, enforced by the kernel in the worker; ``extraction exceeded 60 s of CPU``;
* wall time: per job, enforced here (a worker blocked, or starved of CPU); ``extraction
  exceeded 90 s``;
* output: the answer's size, read here before it is parsed; ``extraction output exceeded …``.

A worker that dies (a parser that aborts, the OOM killer) fails its job with how it died, and
the next job gets a new worker. Native code that cannot allocate under the address-space cap
aborts rather than raising (Rust's ``memory allocation of N bytes failed``, C++'s
``std::bad_alloc``): the worker's last lines on stderr (kept here, :data:`STDERR_TAIL_BYTES`,
and logged) tell that death from any other, and it is answered as the memory limit it is.

A job whose caller is cancelled (the consumer's handling timeout, a drain) kills its worker, so
no abandoned parse keeps a CPU busy.

The worker's answer is data, validated here as untrusted input: a worker that a document took
over can lie about its text, but not run code in the consumer or hand it malformed chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contextcore.knowledge.adapters.worker import HEADER, frame
from contextcore.knowledge.chunk import Chunk, Cut, ModelWindow
from contextcore.knowledge.extract import (
    MAX_HEADING_CHARS,
    MAX_PATH_CHARS,
    ExtractionError,
    Limits,
    Section,
)
from schemas.errors import ContextcoreError

log = logging.getLogger("contextcore.knowledge.sandbox")

MB = 1024 * 1024
STDERR_TAIL_BYTES = 4_096
"""What is kept of a worker's stderr, to say why it died (each line is logged too)."""
OUT_OF_MEMORY = re.compile(
    rb"memory allocation of \d+ bytes failed|std::bad_alloc|MemoryError|out of memory"
    rb"|Cannot allocate memory",
    re.IGNORECASE,
)
"""What the runtimes a worker runs print when an allocation failed under the cap."""


@dataclass(frozen=True)
class SandboxLimits:
    memory_mb: int = 512
    cpu_s: float = 60.0
    wall_s: float = 90.0
    output_mb: int = 64
    recycle_rss_mb: int = 200
    """A worker whose resident memory passed this after a job is replaced (the allocator keeps
    what a large document used)."""

    def __post_init__(self) -> None:
        if self.memory_mb < 128:
            raise ValueError("the extraction memory limit must be at least 128 MB")
        if not 0 < self.cpu_s <= self.wall_s:
            raise ValueError("the CPU limit must be positive and at most the wall limit")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ok: bool
    reason: Annotated[str, Field(max_length=10_000)] | None = None
    limit: str | None = None
    sections: list[tuple[list[int], list[str]]] | None = None
    """Each section's path as indexes in ``parts``, and its paragraphs."""
    parts: list[Annotated[str, Field(max_length=MAX_PATH_CHARS)]] | None = None
    """Every part once (an empty one too: a heading with no text)."""
    headings: list[Annotated[str, Field(max_length=MAX_HEADING_CHARS)]] | None = None
    chunks: dict[str, list[tuple[int, int, str, int]]] | None = None
    """Per model: ordinal, the index of its heading path in ``headings``, text, tokens."""


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.jobs = 0
        self.stderr_tail = b""
        self._stderr = asyncio.create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        """Keep the tail of the worker's stderr and log what it writes, until it closes (read
        all the while, so a worker that writes much never blocks on a full pipe)."""
        stream = self.process.stderr
        if stream is None:
            return
        while data := await stream.read(STDERR_TAIL_BYTES):
            self.stderr_tail = (self.stderr_tail + data)[-STDERR_TAIL_BYTES:]
            text = data[:1_000].decode("utf-8", "replace").strip()
            log.warning("extraction worker %d: %s", self.process.pid, text)

    async def stderr_closed(self) -> bytes:
        """The tail of stderr once the (dead) worker's pipe has closed (or 2 s later: then
        the reader stops)."""
        try:
            await asyncio.wait_for(asyncio.shield(self._stderr), 2.0)
        except TimeoutError:
            self._stderr.cancel()
        return self.stderr_tail

    @property
    def stdin(self) -> asyncio.StreamWriter:
        assert self.process.stdin is not None
        return self.process.stdin

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.process.pid}/statm") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB
        except (OSError, ValueError, IndexError):
            return 0.0

    async def kill(self) -> None:
        # os.kill, not Process.kill: that polls (reaps) a process that has just exited, and
        # the child watcher then reports it as unknown with status 255 instead of how it died.
        # Until the watcher reaps it, the pid cannot name another process.
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
        await self.process.wait()
        await self.stderr_closed()

    async def retire(self) -> None:
        """Let the worker exit on its own (end of input), or kill it if it does not."""
        if self.process.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 2.0)
            except TimeoutError:
                await self.kill()
        await self.stderr_closed()


class _Died(ContextcoreError):
    """The worker ended before it answered."""


class TextSandbox:
    """Extract and chunk documents in bounded worker processes, ``workers`` at a time."""

    def __init__(
        self,
        *,
        workers: int = 2,
        limits: SandboxLimits | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        """``command`` starts one worker (default: this Python, ``-m
        contextcore.knowledge.adapters.worker``); the limits are appended to it."""
        if workers < 1:
            raise ValueError("a sandbox needs at least one worker")
        self.limits = limits or SandboxLimits()
        self._command = list(
            command or [sys.executable, "-m", "contextcore.knowledge.adapters.worker"]
        )
        self._workers = workers
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._spares: set[asyncio.Task[None]] = set()  # workers starting ahead of need
        self._closed = False

    async def cut(
        self,
        *,
        title: str,
        models: dict[str, ModelWindow],
        media_type: str = "",
        document: bytes | None = None,
        sections: list[Section] | None = None,
        limits: Limits | None = None,
    ) -> Cut:
        """The sections of ``document`` (or the stored ``sections``) and their chunks per
        model.

        Raises:
            ExtractionError: why there is no text: the document's own reason, or the bound the
                job passed.
        """
        if (document is None) == (sections is None):
            raise ValueError("give a document or its stored sections, not both")
        job: dict[str, Any] = {
            "title": title,
            "media_type": media_type,
            "limits": vars(limits or Limits()),
            "models": {
                name: {
                    "tokenizer": str(window.tokenizer),
                    "max_tokens": window.settings.max_tokens,
                    "overlap": window.settings.overlap,
                }
                for name, window in models.items()
            },
            "sections": None if sections is None else [[s.path, s.paragraphs] for s in sections],
        }
        async with self._slots:
            return await self._run(
                json.dumps(job).encode(), document or b"", models, limits or Limits()
            )

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*self._spares, return_exceptions=True)
        await asyncio.gather(*(w.retire() for w in self._idle), return_exceptions=True)
        await asyncio.gather(*(w.kill() for w in self._busy), return_exceptions=True)
        self._idle.clear()

    async def _run(
        self, job: bytes, document: bytes, models: dict[str, ModelWindow], limits: Limits
    ) -> Cut:
        worker = await self._worker()
        self._busy.add(worker)
        self._top_up()
        started = time.monotonic()
        reusable = False
        try:
            try:
                async with asyncio.timeout(self.limits.wall_s):
                    raw = await self._exchange(worker, job, document)
            except TimeoutError:
                raise ExtractionError(
                    f"extraction exceeded {self.limits.wall_s:g} s (wall time); the worker "
                    "was stopped"
                ) from None
            except _Died:
                await worker.kill()
                raise ExtractionError(self._death(worker, await worker.stderr_closed())) from None
            cut = self._parse(raw, models, limits)
            reusable = True  # a worker whose job failed is replaced, whatever the reason
            return cut
        finally:
            self._busy.discard(worker)
            if (
                reusable
                and not self._closed
                and worker.rss_mb() < self.limits.recycle_rss_mb
                and len(self._idle) + len(self._busy) + len(self._spares) < self._workers
            ):
                self._idle.append(worker)
            else:  # cancelled, timed out, dead, lying, failed, grown or one too many
                await (worker.retire() if reusable else worker.kill())
            log.debug("a job took %.3f s", time.monotonic() - started)

    async def _exchange(self, worker: _Worker, job: bytes, document: bytes) -> bytes:
        worker.jobs += 1
        try:
            worker.stdin.write(frame(job) + frame(document))
            await worker.stdin.drain()
            head = await worker.stdout.readexactly(HEADER.size)
        except (ConnectionError, asyncio.IncompleteReadError) as error:
            raise _Died from error
        (size,) = HEADER.unpack(head)
        if size > self.limits.output_mb * MB:
            raise ExtractionError(
                f"extraction output exceeded {self.limits.output_mb} MB ({size} bytes)"
            )
        try:
            return await worker.stdout.readexactly(size)
        except asyncio.IncompleteReadError as error:
            raise _Died from error

    def _death(self, worker: _Worker, stderr: bytes) -> str:
        """Why the worker died, as the failed source's reason: the limit it hit, when one
        was (its signal, or what it printed as it went), else how it ended."""
        code = worker.process.returncode
        if OUT_OF_MEMORY.search(stderr):
            return f"extraction exceeded {self.limits.memory_mb} MB of memory"
        if code is not None and code < 0:
            number = -code
            if number == signal.SIGXCPU:
                return f"extraction exceeded {self.limits.cpu_s:g} s of CPU time"
            if number == signal.SIGKILL:
                return (
                    "the extraction process was killed (out of memory: its limit is "
                    f"{self.limits.memory_mb} MB)"
                )
            return f"the extraction process crashed ({signal.Signals(number).name})"
        return f"the extraction process ended unexpectedly (exit status {code})"

    def _top_up(self) -> None:
        """Start workers ahead of need, up to ``workers`` alive: a worker loads its libraries
        while it is idle, so a document that arrives while another is being cut does not wait
        for a process to start (a cold worker cost an upload about a second beside another
        tenant's long document, issue 33)."""
        while not self._closed and len(self._idle) + len(self._busy) + len(self._spares) < (
            self._workers
        ):
            task = asyncio.create_task(self._spare())
            self._spares.add(task)
            task.add_done_callback(self._spares.discard)

    async def _spare(self) -> None:
        try:
            worker = await self._spawn()
        except OSError as error:  # the job that needs it starts its own, and says why
            log.warning("a spare extraction worker did not start: %s", error)
            return
        if self._closed:
            await worker.kill()
        else:
            self._idle.append(worker)

    async def _worker(self) -> _Worker:
        """An idle worker; else one that is starting (it is this job's); else a new one."""
        while True:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.returncode is None:
                    return worker
            if self._closed:
                raise ExtractionError("the service is shutting down")
            if not self._spares:
                return await self._spawn()
            await asyncio.wait(set(self._spares), return_when=asyncio.FIRST_COMPLETED)

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            *self._command,
            "--memory-bytes",
            str(self.limits.memory_mb * MB),
            "--cpu-seconds",
            f"{self.limits.cpu_s:g}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_worker_environment(),
            limit=2**16,
        )
        return _Worker(process)

    def _parse(self, raw: bytes, models: dict[str, ModelWindow], limits: Limits) -> Cut:
        try:
            answer = _Answer.model_validate_json(raw)
        except ValidationError as error:
            raise ExtractionError(
                f"the extraction process answered nonsense ({error.error_count()} problems)"
            ) from None
        if not answer.ok:
            if answer.limit == "memory":
                raise ExtractionError(f"extraction exceeded {self.limits.memory_mb} MB of memory")
            raise ExtractionError(answer.reason or "extraction failed")
        headings, parts = answer.headings, answer.parts
        if (
            answer.sections is None
            or headings is None
            or parts is None
            or answer.chunks is None
            or set(answer.chunks) != set(models)
        ):
            raise ExtractionError("the extraction process answered nonsense (missing parts)")
        if len(answer.sections) > limits.max_chunks or any(
            not 0 <= i < len(parts) for path, _ in answer.sections for i in path
        ):  # each section makes a chunk at least
            raise ExtractionError("the extraction process answered nonsense (sections)")
        # each path shares its parts' one string, as the answer sends each once
        sections = [
            Section(tuple(parts[i] for i in path), paragraphs)
            for path, paragraphs in answer.sections
        ]
        chunks: dict[str, list[Chunk]] = {}
        for model, rows in answer.chunks.items():
            window = models[model].settings
            if (
                not rows
                or len(rows) > limits.max_chunks
                or any(
                    ordinal != i
                    or not 0 <= heading < len(headings)
                    or not 0 < len(text) <= window.max_chars
                    or not 0 < tokens <= window.max_tokens
                    for i, (ordinal, heading, text, tokens) in enumerate(rows)
                )
            ):
                raise ExtractionError("the extraction process answered nonsense (chunks)")
            # each chunk shares its heading's one string: the answer sends each once
            chunks[model] = [Chunk(o, headings[h], text, t) for o, h, text, t in rows]
        return Cut(sections, chunks)


_INHERITED = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")


def _worker_environment() -> dict[str, str]:
    """What a worker sees: no credential, one thread for the tokenizer, two malloc arenas."""
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    env.update(
        {
            "PYTHONDONTWRITEBYTECODE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAYON_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",
        }
    )
    return env
