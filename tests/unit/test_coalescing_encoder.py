"""Concurrent batches share one encode, and each gets its own vectors back in its order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from contextcore.knowledge.encoding import CoalescingEncoder


class Recording:
    model = "m"
    dimensions = 1

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.fail = fail

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        self.release.wait(5)
        if self.fail:
            raise RuntimeError("model broke")
        return [[float(len(t))] for t in texts]


async def test_calls_waiting_behind_an_encode_are_merged_into_the_next() -> None:
    inner = Recording()
    encoder = CoalescingEncoder(inner, max_texts=5)
    first = asyncio.create_task(encoder.encode(["a"]))
    await asyncio.sleep(0.05)  # the first encode runs; these three wait behind it
    rest = [
        asyncio.create_task(encoder.encode(texts)) for texts in (["bb", "ccc"], ["dddd"], ["e"] * 3)
    ]
    await asyncio.sleep(0.05)
    inner.release.set()
    results = await asyncio.gather(first, *rest)
    assert results == [[[1.0]], [[2.0], [3.0]], [[4.0]], [[1.0]] * 3]
    assert inner.calls == [["a"], ["bb", "ccc", "dddd"], ["e", "e", "e"]]  # at most 5 merged


async def test_a_failed_encode_fails_every_caller_merged_into_it() -> None:
    inner = Recording(fail=True)
    inner.release.set()
    encoder = CoalescingEncoder(inner)
    results = await asyncio.gather(
        encoder.encode(["a"]), encoder.encode(["b"]), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    inner.fail = False
    assert await encoder.encode(["cc"]) == [[2.0]], "the next call still works"


async def test_a_cancelled_caller_is_skipped() -> None:
    inner = Recording()
    encoder = CoalescingEncoder(inner)
    first = asyncio.create_task(encoder.encode(["a"]))
    await asyncio.sleep(0.05)
    gone = asyncio.create_task(encoder.encode(["gone"]))
    kept = asyncio.create_task(encoder.encode(["kept"]))
    await asyncio.sleep(0.01)
    gone.cancel()
    inner.release.set()
    assert await first == [[1.0]]
    assert await kept == [[4.0]]
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert inner.calls[1] == ["kept"]


async def test_the_next_encode_takes_each_lane_in_turn_so_one_tenant_never_waits_out_a_flood() -> (
    None
):
    """Issue 33: A's ten batches wait behind a running encode, then B's one. The next encode
    takes A's first batch and B's, not A's next ones: B waits for one encode, not for A's
    flood. Each lane keeps its order."""
    inner = Recording()
    encoder = CoalescingEncoder(inner, max_texts=4)
    first = asyncio.create_task(encoder.encode(["a0"], "A"))
    await asyncio.sleep(0.05)  # the first encode runs
    flood = [asyncio.create_task(encoder.encode([f"a{i}", f"a{i}"], "A")) for i in range(1, 11)]
    theirs = asyncio.create_task(encoder.encode(["b"], "B"))
    await asyncio.sleep(0.05)
    inner.release.set()
    await asyncio.gather(first, *flood, theirs)
    assert inner.calls[0] == ["a0"]
    assert inner.calls[1] == ["a1", "a1", "b"]  # B's rides the next encode
    assert [t for call in inner.calls[2:] for t in call] == [
        text for i in range(2, 11) for text in (f"a{i}", f"a{i}")
    ]
