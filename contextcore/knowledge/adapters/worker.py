"""The process that turns an untrusted document into sections and chunks (``python -m
contextcore.knowledge.adapters.worker``), and the frames it speaks.

A parser fed a hostile document can allocate without end, loop for minutes, or crash; here it
can only take this process with it. The worker caps itself before it reads a job:

* its address space (``RLIMIT_AS``): an allocation past the cap fails, and the job answers
  ``memory`` (a parser that aborts instead leaves a process that died, which the parent reports);
* its CPU time (``RLIMIT_CPU``, reset before each job): the kernel ends a job that spins with
  SIGXCPU;
* no core dumps, and the first place in line for the kernel's OOM killer (``oom_score_adj``
  1000), so a cgroup short of memory kills a worker before the consumer.

The parent (:mod:`contextcore.knowledge.adapters.sandbox`) bounds the wall time and the size of the
answer, and starts the worker with an environment that holds no credential.

The protocol, on stdin and stdout, one job at a time: a frame is an 8-byte big-endian length and
that many bytes. The parent sends the job (JSON) and then the document (raw bytes; empty when
the job carries stored sections); the worker answers one JSON frame. JSON, never pickle: the
parent reads what a process that parsed hostile input wrote, and a pickle would let a worker
that was taken over run code in the consumer.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import resource
import signal
import struct
import sys
from pathlib import Path
from typing import IO, Any

from contextcore.knowledge.chunk import ChunkSettings, WordPieceTokenizer, chunk
from contextcore.knowledge.extract import ExtractionError, Limits, Section, bounded_path, extract

HEADER = struct.Struct(">Q")
MAX_JOB_BYTES = 64 * 1024 * 1024
"""The largest frame the worker reads (the document limit is far below it)."""


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def read_frame(stream: IO[bytes], limit: int) -> bytes | None:
    """The next frame of ``stream``; ``None`` at a clean end of input.

    Raises:
        EOFError: the stream ended inside a frame.
        ValueError: the frame is longer than ``limit``.
    """
    head = stream.read(HEADER.size)
    if not head:
        return None
    if len(head) < HEADER.size:
        raise EOFError("the stream ended inside a frame header")
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise ValueError(f"a frame of {size} bytes is over the {limit}-byte limit")
    body = stream.read(size)
    if len(body) < size:
        raise EOFError("the stream ended inside a frame")
    return body


def cut(job: dict[str, Any], document: bytes) -> dict[str, Any]:
    """One job: extract ``document`` (or take the job's stored ``sections``) and chunk the text
    for every model the job names. Every reason to fail is an answer, never an exception.

    A chunk's heading is sent once, in ``headings``, and each chunk names it by index; so is
    each part of a section's path, in ``parts``: a document of many small sections under one
    long heading would otherwise repeat it per chunk and per section (33,000 times a
    1,000-character heading made a 64 MB answer of a 300 KB document; 9,000 sections under a
    6,000-character one, 54 MB of an 87 KB document)."""
    try:
        limits = Limits(**job["limits"])
        if job.get("sections") is None:
            sections = extract(document, job["media_type"], limits)
        else:
            sections = [Section(bounded_path(path), list(paras)) for path, paras in job["sections"]]
        headings: dict[str, int] = {}
        chunks = {}
        for model, window in job["models"].items():
            tokenizer = _tokenizer(window["tokenizer"])
            settings = ChunkSettings(max_tokens=window["max_tokens"], overlap=window["overlap"])
            cut_chunks = chunk(
                job["title"], sections, tokenizer, settings, max_chunks=limits.max_chunks
            )
            if not cut_chunks:
                raise ExtractionError("the document has no text")
            chunks[model] = [
                [c.ordinal, headings.setdefault(c.section, len(headings)), c.text, c.tokens]
                for c in cut_chunks
            ]
    except ExtractionError as error:
        return {"ok": False, "reason": str(error)}
    except MemoryError:
        return {"ok": False, "limit": "memory"}
    except RecursionError:
        return {"ok": False, "reason": "the document is nested too deeply to read"}
    parts: dict[str, int] = {}
    return {
        "ok": True,
        "sections": [
            [[parts.setdefault(p, len(parts)) for p in s.path], s.paragraphs] for s in sections
        ],
        "parts": list(parts),
        "headings": list(headings),
        "chunks": chunks,
    }


_TOKENIZERS: dict[str, WordPieceTokenizer] = {}


def _tokenizer(path: str) -> WordPieceTokenizer:
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = WordPieceTokenizer(Path(path))
    return _TOKENIZERS[path]


def _limit_self(memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")
    _die_with_parent()


def _die_with_parent() -> None:
    """SIGKILL this worker when the consumer dies (Linux's PR_SET_PDEATHSIG), so a consumer
    killed mid-job leaves no parse running."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call: nothing will signal us
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _cpu_budget(seconds: float) -> None:
    """Let the next job use ``seconds`` of CPU from now (the soft limit is a total)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))


def serve(stdin: IO[bytes], stdout: IO[bytes], *, cpu_s: float) -> int:
    """Answer jobs until the parent closes stdin. A job that failed on memory ends the
    process after its answer: what the allocator kept is given back by exiting."""
    while True:
        raw = read_frame(stdin, MAX_JOB_BYTES)
        if raw is None:
            return 0
        document = read_frame(stdin, MAX_JOB_BYTES)
        if document is None:
            raise EOFError("a job came without its document")
        _cpu_budget(cpu_s)
        answer = cut(json.loads(raw), document)
        del raw, document
        stdout.write(frame(json.dumps(answer, ensure_ascii=False).encode("utf-8", "replace")))
        stdout.flush()
        if answer.get("limit") == "memory":
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextcore.knowledge.adapters.worker")
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    _limit_self(args.memory_bytes)
    return serve(sys.stdin.buffer, sys.stdout.buffer, cpu_s=args.cpu_seconds)


if __name__ == "__main__":
    sys.exit(main())
