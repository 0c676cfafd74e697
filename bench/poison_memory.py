"""What one hostile record can make a process hold: chunking and encoding, before and now.

    python -m bench.poison_memory [--smoke]

Each case runs in a fresh process (its peak RSS is its own), two ways in one run:

* ``chunk``: the section 8 MB of ``<p>x</p>`` becomes (two million characters, one piece per
  ``x``), chunked for the default model. ``before``: the whole text tokenized at once, as the
  chunker did until issue 32 (its offsets and word ids, which the windows read); ``now``:
  :func:`contextcore.knowledge.chunk.chunk`, which tokenizes 16 KB at a time.
* ``encode``: the reviewer's embedding batch, 64 chunks of 100,000 ``!`` (the wire now refuses
  it: a chunk holds at most 65,536 characters), and the largest batch the wire still takes
  aimed at the same memory, 15 chunks of 65,536 ``!``, through
  :class:`~contextcore.knowledge.adapters.encoder.SentenceTransformerEncoder` (the embedding
  consumer's).
  ``before``: with the cut before tokenizing disabled and every text tokenized at once, as until
  issue 32; ``now``: as shipped. The model's own memory is in both.

Prints peak RSS (MB) and CPU seconds per case, and the CPU's flags (state them beside the
figures: docs/knowledge.md). ``--smoke``: every case and way at a fiftieth of the chunked text
and a few chunks per batch, in seconds (tests/integration/test_bench_smoke.py); a case that fails
then exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

CASES = ("chunk", "encode-64x100000", "encode-15x65536")
SMOKE_CASES = ("chunk", "encode-4x100000", "encode-2x65536")
WORDS, SMOKE_WORDS = 1_000_000, 20_000
"""The chunked text's pieces (``x`` each)."""


def run(case: str, how: str, words: int = WORDS) -> dict[str, Any]:
    started = time.process_time()
    if case == "chunk":
        from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
        from contextcore.knowledge.chunk import ChunkSettings, WordPieceTokenizer, chunk
        from contextcore.knowledge.extract import Section

        tokenizer = WordPieceTokenizer(default_model_path(DEFAULT_MODEL))
        text = " ".join(["x"] * words)
        started = time.process_time()
        if how == "before":
            encoding = tokenizer._tokenizer.encode(text, add_special_tokens=False)
            pieces = (encoding.offsets, encoding.word_ids)
            count = len(pieces[0])
        else:
            count = len(chunk("X", [Section((), [text])], tokenizer, ChunkSettings()))
    else:
        from contextcore.knowledge.adapters import encoder as module
        from contextcore.knowledge.adapters.settings import KnowledgeSettings

        chunks, length = (int(n) for n in case.removeprefix("encode-").split("x"))
        loaded = KnowledgeSettings().load_encoder()
        assert isinstance(loaded, module.SentenceTransformerEncoder)
        if how == "before":
            loaded.max_chars = 10**9
            module.TOKENIZE_AT_ONCE = 10**6
        started = time.process_time()
        count = len(loaded.encode(["!" * length] * chunks))
    return {
        "count": count,
        "cpu_s": time.process_time() - started,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def in_child(case: str, how: str, smoke: bool = False) -> dict[str, Any]:
    words = SMOKE_WORDS if smoke else WORDS
    done = subprocess.run(
        [sys.executable, "-m", "bench.poison_memory", "--child", case, how, str(words)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 and smoke:  # small cases: a child that fails is broken
        raise SystemExit(f"{case} {how}: exit {done.returncode}: {done.stderr[-2000:]}")
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(run(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(prog="python -m bench.poison_memory", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help=f"small cases: {SMOKE_CASES}")
    args = parser.parse_args()
    print(f"CPU flags: {cpu_flags()}")
    print(f"{'case':<18} {'before':>28} {'now':>28}")
    for case in SMOKE_CASES if args.smoke else CASES:
        figures = [in_child(case, how, args.smoke) for how in ("before", "now")]
        print(f"{case:<18} " + " ".join(f"{figure(f):>28}" for f in figures))


def figure(result: dict[str, Any]) -> str:
    if "failed" in result:
        return f"failed: {result['failed'][0][:20]}"
    return f"{result['peak_mb']:,.0f} MB, {result['cpu_s']:.1f} s CPU"


def cpu_flags() -> str:
    wanted = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2")
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(line for line in info if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return ", ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted)


if __name__ == "__main__":
    main()
