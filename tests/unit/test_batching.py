"""Model batches: every text once, at one of few shapes, at the least padded cost."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextcore.knowledge.adapters.encoder import LENGTH_STEP, OPENVINO_CONFIG
from contextcore.knowledge.batching import Shapes, least_padding

lengths_strategy = st.lists(st.integers(min_value=1, max_value=256), max_size=40)


def price(lengths: list[int], batches: list[list[int]], call_cost: int, shapes: Shapes) -> int:
    return sum(len(b) * shapes.length(max(lengths[i] for i in b)) + call_cost for b in batches)


def partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every way to split ``items`` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


@given(lengths_strategy, st.integers(1, 33), st.integers(0, 2_000))
def test_every_text_once_within_the_batch_size(
    lengths: list[int], max_batch: int, call_cost: int
) -> None:
    batches = least_padding(lengths, Shapes.exact(max_batch), call_cost)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= max_batch for b in batches)


shapes_strategy = st.one_of(
    st.integers(1, 4).map(Shapes.exact),
    st.builds(Shapes.bucketed, st.integers(1, 7), st.integers(1, 20), st.integers(1, 8)),
)


@given(st.lists(st.integers(1, 20), min_size=1, max_size=7), shapes_strategy, st.integers(0, 40))
def test_no_split_of_the_texts_costs_less(
    lengths: list[int], shapes: Shapes, call_cost: int
) -> None:
    best = min(
        price(lengths, p, call_cost, shapes)
        for p in partitions(list(range(len(lengths))))
        if all(len(b) in shapes.sizes for b in p)
    )
    batches = least_padding(lengths, shapes, call_cost)
    assert price(lengths, batches, call_cost, shapes) == best


@given(lengths_strategy)
def test_free_calls_pad_nothing(lengths: list[int]) -> None:
    for batch in least_padding(lengths, Shapes.exact(32), 0):
        assert len({lengths[i] for i in batch}) == 1


@given(lengths_strategy, st.integers(1, 33))
def test_dear_calls_make_the_fewest_batches(lengths: list[int], max_batch: int) -> None:
    batches = least_padding(lengths, Shapes.exact(max_batch), 10**9)
    assert len(batches) == math.ceil(len(lengths) / max_batch)


def test_a_short_tail_is_not_padded_to_the_long_head() -> None:
    lengths = [256] * 20 + [40] * 12
    batches = least_padding(lengths, Shapes.exact(32), 64)
    assert [sorted({lengths[i] for i in b}) for b in batches] == [[256], [40]]


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Shapes.exact(0)
    with pytest.raises(ValueError, match="include 1"):
        Shapes((2, 4))


@given(lengths_strategy, st.integers(1, 64), st.integers(0, 2_000))
def test_bucketed_batches_run_at_their_few_shapes(
    lengths: list[int], max_batch: int, call_cost: int
) -> None:
    shapes = Shapes.bucketed(max_batch, 256, LENGTH_STEP)
    batches = least_padding(lengths, shapes, call_cost)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) in shapes.sizes
        assert len(batch) <= max_batch
        width = shapes.length(max(lengths[i] for i in batch))
        assert width % LENGTH_STEP == 0
        assert width <= 256


def test_the_embedding_shapes_fit_openvinos_kernel_cache() -> None:
    """Every shape the embedding encoder calls the model at (batches up to 32 texts, 256 word
    pieces) keeps its compiled kernels: none is compiled twice."""
    shapes = Shapes.bucketed(32, 256, LENGTH_STEP)
    assert shapes.sizes == (1, 2, 4, 8, 16, 32)
    assert shapes.count == 48 <= int(OPENVINO_CONFIG["CPU_RUNTIME_CACHE_CAPACITY"])
