"""Cut one encode call into model batches that waste the least on padding, at few shapes.

A batch runs at the length of its longest text, so every shorter text in it pays for pad
tokens. sentence-transformers sorts a call by *characters* and cuts fixed batches of 32, which
on our documentation chunks pads a document's batch to 1.4 times its real tokens. Here texts
are sorted by their *word pieces* and cut where the padding saved outweighs the cost of one
more model call (``call_cost``, in tokens), exactly, by dynamic programming. Measured on 1,046
git-doc chunks, OpenVINO, this 2-core machine: 1.2-1.4x the rate of the same texts encoded by
sentence-transformers alone (docs/performance.md).

A batch is also run at one of a few :class:`Shapes`: its size one of a few, its length rounded
up to a step. OpenVINO compiles kernels for every input shape it meets and keeps a bounded
number of them; documents come in every length, so batches at their exact shapes meant a
compile on most calls and a process that grew for many minutes (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def padded(longest: int, step: int, max_length: int) -> int:
    """``longest`` rounded up to a multiple of ``step``, at most ``max_length``."""
    return min(max_length, -(-longest // step) * step)


@dataclass(frozen=True)
class Shapes:
    """The shapes a model is called at: ``sizes`` texts per batch (1 among them), and a length
    rounded up to a multiple of ``step``, at most ``max_length``."""

    sizes: tuple[int, ...]
    step: int = 1
    max_length: int = 1 << 30

    def __post_init__(self) -> None:
        if 1 not in self.sizes or min(self.sizes) < 1:
            raise ValueError("the batch sizes must include 1 and be positive")
        if self.step < 1 or self.max_length < 1:
            raise ValueError("step and max_length must be at least 1")

    @classmethod
    def exact(cls, max_batch: int) -> Shapes:
        """Any batch size up to ``max_batch``, at the longest text's own length."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        return cls(tuple(range(1, max_batch + 1)))

    @classmethod
    def bucketed(cls, max_batch: int, max_length: int, step: int) -> Shapes:
        """Powers of two up to ``max_batch`` (and ``max_batch``), lengths in steps of ``step``."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        powers = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch}
        return cls(tuple(sorted(powers | {max_batch})), step, max_length)

    def length(self, longest: int) -> int:
        """The length a batch whose longest text has ``longest`` word pieces runs at."""
        return padded(longest, self.step, self.max_length)

    @property
    def count(self) -> int:
        """How many shapes there are (texts no longer than ``max_length``)."""
        return len(self.sizes) * -(-self.max_length // self.step)


def least_padding(lengths: Sequence[int], shapes: Shapes, call_cost: int) -> list[list[int]]:
    """Batches (lists of indexes into ``lengths``), each of a size in ``shapes``, that minimise
    ``sum(len(batch) * shapes.length(longest(batch))) + call_cost * len(batches)``; longest
    texts first. Exact: some best split cuts the texts sorted longest first into runs (give the
    batch of the longest text the longest texts: its length stays, no other batch's grows)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    width = [shapes.length(lengths[i]) for i in order]
    # cost[i]: the least cost of the first i texts (longest first); cut[i]: where its last batch
    # starts. A batch order[j:i] runs at width[j], its longest text's shape.
    cost = [0] * (len(order) + 1)
    cut = [0] * (len(order) + 1)
    for i in range(1, len(order) + 1):
        cost[i], cut[i] = min(
            (cost[i - size] + size * width[i - size] + call_cost, i - size)
            for size in shapes.sizes
            if size <= i
        )
    batches: list[list[int]] = []
    end = len(order)
    while end > 0:
        batches.append(order[cut[end] : end])
        end = cut[end]
    return batches[::-1]
