"""Concurrent batches share one encode, and each gets its own vectors back in its order."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence

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
    is B's, alone (a light lane beside a heavy one), and then A's in order: B waits for the
    encode that was running, not for A's flood nor for a full encode of A's passages. Each lane
    keeps its order."""
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
    assert inner.calls[1] == ["b"]  # B's goes next, in an encode of its own
    assert inner.calls[2] == ["a1", "a1", "a2", "a2"]
    assert [t for call in inner.calls[2:] for t in call] == [
        text for i in range(1, 11) for text in (f"a{i}", f"a{i}")
    ]


def by_hand(
    max_texts: int,
) -> tuple[Callable[..., None], Callable[[], list[str]]]:
    """An encoder whose waiting calls a test sets by hand (``wait(lane, *texts)``), and the
    texts of each next encode it would run (``next_texts()``), none of them run."""
    encoder = CoalescingEncoder(Recording(), max_texts=max_texts)
    loop = asyncio.get_running_loop()

    def wait(lane: str, *texts: str) -> None:
        encoder._waiting.setdefault(lane, deque()).append((list(texts), loop.create_future()))

    def next_texts() -> list[str]:
        return [t for texts, _ in encoder._next_encode() for t in texts]

    return wait, next_texts


async def test_light_lanes_go_first_but_never_twice_in_a_row_while_a_heavy_one_waits() -> None:
    """The heavy lanes get at least every other encode, however much light traffic comes."""
    wait, next_texts = by_hand(max_texts=4)  # light: one text waiting at most

    for i in range(5):
        wait("A", f"a{i}", f"a{i}")
    wait("B", "b0")
    wait("C", "c0")
    assert next_texts() == ["b0", "c0"]  # the light lanes, alone
    wait("D", "d0")  # more light traffic arrives
    assert next_texts() == ["a0", "a0", "d0"]  # in turn, A included: not light twice
    wait("E", "e0")
    assert next_texts() == ["e0"]
    assert next_texts() == ["a1", "a1", "a2", "a2"]
    assert next_texts() == ["a3", "a3", "a4", "a4"]  # only A left: it is not light


async def test_a_lane_a_quarter_of_the_heaviest_is_light_even_when_both_are_small() -> None:
    """A flood's lane holds only its batches in flight, often under a quarter of an encode:
    beside it a lane of a quarter of its texts or fewer still goes alone; lanes alike share."""
    wait, next_texts = by_hand(max_texts=64)  # light: 16 texts at most

    for i in range(13):
        wait("A", f"a{i}")
    wait("B", "b0", "b0")
    wait("C", "c0", "c0", "c0", "c0")  # more than 13 // 4: merged with A's
    assert next_texts() == ["b0", "b0"]  # B alone: 2 <= 13 // 4
    # C's 4 texts are over a quarter of A's 13: C is merged with A, in turn, and not light
    assert next_texts() == ["a0", "c0", "c0", "c0", "c0", *(f"a{i}" for i in range(1, 13))]
    for i in range(4):
        wait("D", f"d{i}")
    wait("E", "e0")
    assert next_texts() == ["e0"]  # 1 <= 4 // 4
    assert next_texts() == ["d0", "d1", "d2", "d3"]
    wait("F", "f0")
    wait("G", "g0")
    assert next_texts() == ["f0", "g0"]  # alike: neither is light, they share
