"""An encoder on a busy node: the embedding group's OpenVINO encode, its threads pinned or free,
alone and beside processes that keep cores busy, in one run.

    python -m bench.contention [--busy 0 2 3] [--sizes 15 64] [--calls 15] [--smoke]

A shared node's encoder is never alone: the database, the broker and the other consumers take
turns on its cores. OpenVINO splits one encode over every core and by default pins a thread to
each, so an encode waits for the busiest core's turn. Each configuration loads its own encoder
in a fresh process (OpenVINO reads its config when it compiles), warms it at every size, then
times ``--calls`` encodes of each size (the held-out passages: long ones) with ``--busy`` busy
processes of normal priority beside it. Printed: the median and slowest encode per
configuration, size and neighbours, and the CPU flags (compare ratios within one run).
``--smoke``: every configuration at tiny sizes, in seconds (tests/integration/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

from bench.corpora import CACHE
from bench.fairness import cpu_flags
from bench.ingest import passages
from bench.processes import burning

CONFIGS = {
    "pinned (OpenVINO's default)": {"ENABLE_CPU_PINNING": "YES"},
    "free (the embedding group's)": {"ENABLE_CPU_PINNING": "NO"},
    "one thread, free (the query encoder's)": {
        "ENABLE_CPU_PINNING": "NO",
        "INFERENCE_NUM_THREADS": "1",
    },
}


def measure(
    name: str, busy: list[int], sizes: list[int], calls: int, pages: int | None = None
) -> None:
    """One configuration in this (fresh) process: every size beside every number of
    neighbours."""
    from contextcore.knowledge.adapters import encoder as module
    from contextcore.knowledge.adapters.settings import KnowledgeSettings

    module.OPENVINO_CONFIG.update(CONFIGS[name])  # read when the model is compiled, below
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = module.SentenceTransformerEncoder(
        module.DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
    )
    texts = [text.decode() for _, text in passages(max(sizes), pages)]
    for size in sizes:
        for _ in range(3):
            encoder.encode(texts[:size])
    for neighbours in busy:
        with burning(neighbours):  # each a whole core's worth
            time.sleep(0.5)
            for size in sizes:
                timings = []
                for _ in range(calls):
                    started = time.perf_counter()
                    encoder.encode(texts[:size])
                    timings.append((time.perf_counter() - started) * 1000)
                print(
                    f"  {name:40s} {size:3d} passages, {neighbours} busy beside: "
                    f"p50 {statistics.median(timings):6,.0f} ms, max {max(timings):6,.0f} ms",
                    flush=True,
                )


SMOKE = {"busy": [0, 1], "sizes": [4], "calls": 2}
"""``--smoke``: the sizes of a smoke run."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2, 3])
    parser.add_argument("--sizes", type=int, nargs="+", default=[15, 64])
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; the passages of a few pages
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    pages = 2 if args.smoke else None
    print(f"CPU flags: {cpu_flags()}; {multiprocessing.cpu_count()} cores")
    context = multiprocessing.get_context("spawn")
    for name in CONFIGS:
        process = context.Process(
            target=measure, args=(name, args.busy, args.sizes, args.calls, pages)
        )
        process.start()
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"{name}: the measuring process exited {process.exitcode}")


if __name__ == "__main__":
    main()
