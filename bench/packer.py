"""Packer throughput and builder overhead, in process. Prints figures; never passes or fails.

* packing 100, 1,000 and 10,000 items spread over 10 sources (mixed kinds, a quarter of them
  sharing subject keys, budgets that cut about half): items/s and ms per pack (best of N);
* the builder's own overhead with ten instant in-process sources: ``build`` time minus the time
  to pack the same items directly (median of many runs).

Targets (issue 3): 10,000 items packed in under 50 ms; builder overhead under 1 ms.

    .venv/bin/python bench/packer.py
    .venv/bin/python -m bench.packer --smoke   # 100 and 1,000 items, few runs: seconds
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import uuid

from contextcore.builder import DefaultContextBuilder
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from schemas.context import (
    CLASS_ORDER,
    ContextItem,
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)

SOURCES = [f"source{i}" for i in range(10)]


def make_items(count: int) -> list[ContextItem]:
    items = []
    for i in range(count):
        source = SOURCES[i % len(SOURCES)]
        items.append(
            ContextItem(
                source=source,
                kind=CLASS_ORDER[i % len(SOURCES)],
                title=f"Field {i}",
                body=f"value {i} of a fact that is about this long, with\nsome line breaks\tinside",
                subject_key=f"crm.company:{i % (count // 4 or 1)}:field" if i % 4 == 0 else None,
                ref=ResourceRef(kind="crm.company", id=str(i)),
                rank_in_section=i % 3,
            )
        )
    return items


def make_policy(count: int) -> ContextPolicy:
    per_source = max(20, count * 25 // len(SOURCES) // 2)  # roughly half the items fit
    return ContextPolicy(
        sources=[ContextSourceSpec(name=s, token_budget=per_source) for s in SOURCES],
        total_token_budget=per_source * len(SOURCES),
    )


def timings_ms(fn: object, repeat: int) -> tuple[float, float]:
    """(best, median) of ``repeat`` runs; the VM here is noisy, so both are printed."""
    assert callable(fn)
    timings = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - started)
    return min(timings) * 1000, statistics.median(timings) * 1000


class InstantSource:
    def __init__(self, name: str, items: list[ContextItem]) -> None:
        self.name = name
        self.items = items
        from pydantic import BaseModel

        self.options_schema = BaseModel

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        return self.items


async def builder_overhead(items_per_source: int, runs: int = 2000) -> tuple[float, float]:
    items = make_items(items_per_source * len(SOURCES))
    by_source = {s: [i for i in items if i.source == s] for s in SOURCES}
    registry = ContextSourceRegistry([InstantSource(s, by_source[s]) for s in SOURCES])
    policy = make_policy(len(items))
    packer = ContextPacker()
    builder = DefaultContextBuilder(registry, packer)
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
        ),
        query="q",
        entities=(),
    )
    ordered = [i for s in SOURCES for i in by_source[s]]
    builds, packs = [], []
    for _ in range(runs):
        started = time.perf_counter()
        await builder.build(request, policy)
        builds.append(time.perf_counter() - started)
        started = time.perf_counter()
        packer.pack(ordered, policy)
        packs.append(time.perf_counter() - started)
    return statistics.median(builds) * 1000, statistics.median(packs) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.packer", description=__doc__)
    parser.add_argument(
        "--smoke", action="store_true", help="100 and 1,000 items, 3 packs, 50 builds: seconds"
    )
    args = parser.parse_args()
    packer = ContextPacker()
    print("packer, 10 sources:")
    for count in (100, 1_000) if args.smoke else (100, 1_000, 10_000):
        items, policy = make_items(count), make_policy(count)
        brief = packer.pack(items, policy)
        best, median = timings_ms(
            lambda items=items, policy=policy: packer.pack(items, policy),
            repeat=3 if args.smoke else 30,
        )
        kept = count - sum(brief.dropped.values())
        print(
            f"  {count:>6} items: best {best:7.2f} ms, median {median:7.2f} ms per pack, "
            f"{count / best * 1000:>9,.0f} items/s at best (kept {kept}, {brief.tokens} tokens)"
        )
    for per_source in (0, 1, 10):
        build_ms, pack_ms = asyncio.run(builder_overhead(per_source, 50 if args.smoke else 2000))
        print(
            f"builder, 10 instant sources x {per_source} items: build {build_ms:.3f} ms, "
            f"pack alone {pack_ms:.3f} ms, builder overhead {build_ms - pack_ms:.3f} ms "
            "(medians)"
        )


if __name__ == "__main__":
    main()
