"""Hostile documents: CPU time and peak memory of extraction, against the readers they replaced.

    python -m bench.bombs [--quick] [--smoke]

Each document is read in a fresh process (so each peak RSS is its own) three ways:

* ``before``: the readers of issue 8, kept here as the baseline: BeautifulSoup over the
  standard library's parser, walking up to the root for every block, and pypdf's text per page;
* ``now``: :func:`contextcore.knowledge.extract.extract`, in process;
* ``sandbox``: the same through :class:`~contextcore.knowledge.adapters.sandbox.TextSandbox` (the
  consumer's path: a worker process, its limits, the chunking for the default model), wall time.

A baseline is stopped at ``--budget`` seconds of CPU (its figure then reads ``>``). Figures go
to docs/knowledge.md; state the CPU beside them (``/proc/cpuinfo``). ``--smoke``: each kind of
document at a small size, every way, in seconds (tests/integration/test_bench_smoke.py); its
figures mean little.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.sandbox import SandboxLimits, TextSandbox
from contextcore.knowledge.chunk import ChunkSettings, ModelWindow
from contextcore.knowledge.extract import ExtractionError, Limits, extract
from tests.documents import flat_tags_html, memory_bomb_pdf, nesting_bomb_html, shared_stream_pdf

UNBOUNDED = Limits(max_chars=10**9, max_bytes=10**9)


def documents(quick: bool, smoke: bool = False) -> dict[str, tuple[Callable[[], bytes], str]]:
    if smoke:
        return {
            "200 nested paragraphs": (lambda: nesting_bomb_html(200), "text/html"),
            "50 pages sharing one 100 KB stream": (
                lambda: shared_stream_pdf(50, text_lines=1),
                "application/pdf",
            ),
            "100 KB of unclosed tags": (lambda: flat_tags_html(100_000), "text/html"),
            "4 pages inflating to 80 MB": (lambda: memory_bomb_pdf(pages=4), "application/pdf"),
        }
    nesting = (2_000, 5_000) if quick else (2_000, 5_000, 20_000)
    docs: dict[str, tuple[Callable[[], bytes], str]] = {
        f"{n:,} nested paragraphs": (lambda n=n: nesting_bomb_html(n), "text/html")  # type: ignore[misc]
        for n in nesting
    }
    docs["2,000 pages sharing one 100 KB stream"] = (
        lambda: shared_stream_pdf(2_000, text_lines=1),
        "application/pdf",
    )
    docs["1 MB of unclosed tags"] = (lambda: flat_tags_html(1_000_000), "text/html")
    docs["8 MB of unclosed tags"] = (lambda: flat_tags_html(8_000_000), "text/html")
    docs["0.8 MB PDF inflating to 800 MB"] = (memory_bomb_pdf, "application/pdf")
    return docs


# ---------------------------------------------------------------- the readers they replaced

_BLOCKS = ("p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption", "caption")
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def before_html(data: bytes) -> int:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data.decode(), "html.parser")
    for hidden in soup(["script", "style", "noscript", "template", "head"]):
        hidden.decompose()
    paragraphs = 0
    for element in soup.find_all([*_HEADINGS, *_BLOCKS]):
        if element.find_parent(_BLOCKS) is None and element.name in _BLOCKS:
            paragraphs += bool(element.get_text(" ").strip())
    return paragraphs


def before_pdf(data: bytes) -> int:
    from pypdf import PdfReader

    return sum(bool(page.extract_text()) for page in PdfReader(io.BytesIO(data)).pages)


# ------------------------------------------------------------------------------- one run


def _measure(how: str, name: str, quick: bool, budget: float, smoke: bool) -> dict[str, Any]:
    make, media_type = documents(quick, smoke)[name]
    data = make()
    resource.setrlimit(resource.RLIMIT_CPU, (int(budget) + 1, int(budget) + 2))
    started = time.process_time()
    outcome = "ok"
    try:
        if how == "before":
            (before_pdf if media_type == "application/pdf" else before_html)(data)
        else:
            extract(data, media_type, UNBOUNDED)
    except ExtractionError as error:
        outcome = f"failed: {str(error)[:60]}"
    except MemoryError:
        outcome = "out of memory"
    return {
        "cpu_s": time.process_time() - started,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "outcome": outcome,
        "bytes": len(data),
    }


def in_child(how: str, name: str, quick: bool, budget: float, smoke: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.bombs", "--child", how, name, "--budget", str(budget)]
    if quick:
        command.append("--quick")
    if smoke:
        command.append("--smoke")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 and smoke:  # small documents: a child that fails is broken
        raise SystemExit(f"{how} {name}: exit {done.returncode}: {done.stderr[-2000:]}")
    if done.returncode != 0:
        return {"cpu_s": budget, "peak_mb": float("nan"), "outcome": f"> {budget:g} s", "bytes": 0}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def through_sandbox(data: bytes, media_type: str) -> tuple[float, str]:
    sandbox = TextSandbox(workers=1, limits=SandboxLimits())
    windows = {DEFAULT_MODEL: ModelWindow(default_model_path(DEFAULT_MODEL), ChunkSettings())}
    started = time.monotonic()
    try:
        cut = await sandbox.cut(title="Bomb", models=windows, media_type=media_type, document=data)
        outcome = f"{len(cut.chunks[DEFAULT_MODEL])} chunks"
    except ExtractionError as error:
        outcome = f"failed: {str(error)[:70]}"
    finally:
        await sandbox.close()
    return time.monotonic() - started, outcome


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.bombs")
    parser.add_argument("--quick", action="store_true", help="skip the 20,000-level document")
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per baseline")
    parser.add_argument(
        "--smoke", action="store_true", help="small documents, every way, in seconds; budget 10 s"
    )
    parser.add_argument("--child", nargs=2, metavar=("HOW", "DOCUMENT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:  # its budget, unless given
        parser.set_defaults(budget=10.0)
        args = parser.parse_args()
    if args.child:
        how, name = args.child
        print(json.dumps(_measure(how, name, args.quick, args.budget, args.smoke)))
        return
    flags = _cpu_flags()
    print(f"CPU flags: {flags or 'none of amx/avx512_bf16'}; default sandbox limits")
    print(f"{'document':40s} {'size':>9s} | {'before':>18s} | {'now':>18s} | sandbox (wall)")
    for name, (make, media_type) in documents(args.quick, args.smoke).items():
        before = in_child("before", name, args.quick, args.budget, args.smoke)
        now = in_child("now", name, args.quick, args.budget, args.smoke)
        wall, outcome = asyncio.run(through_sandbox(make(), media_type))
        print(
            f"{name:40s} {now['bytes'] / 1e3:7.0f}KB | "
            f"{_figure(before, args.budget):>18s} | {_figure(now, args.budget):>18s} | "
            f"{wall:6.2f} s  {outcome}",
            flush=True,
        )


def _figure(result: dict[str, Any], budget: float) -> str:
    if result["outcome"].startswith(">"):
        return f"> {budget:g} s CPU"
    return f"{result['cpu_s']:6.2f} s {result['peak_mb']:5.0f} MB"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(line for line in info if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return ""
    return " ".join(f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags)


if __name__ == "__main__":
    main()
