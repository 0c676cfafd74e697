"""Model batches: every text once, within the batch size, at the least padded cost."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextcore.knowledge.batching import least_padding

lengths_strategy = st.lists(st.integers(min_value=1, max_value=256), max_size=40)


def price(lengths: list[int], batches: list[list[int]], call_cost: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) + call_cost for b in batches)


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
    batches = least_padding(lengths, max_batch, call_cost)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(1 <= len(b) <= max_batch for b in batches)


@given(
    st.lists(st.integers(1, 20), min_size=1, max_size=7),
    st.integers(1, 4),
    st.integers(0, 40),
)
def test_no_split_of_the_texts_costs_less(
    lengths: list[int], max_batch: int, call_cost: int
) -> None:
    best = min(
        price(lengths, p, call_cost)
        for p in partitions(list(range(len(lengths))))
        if all(len(b) <= max_batch for b in p)
    )
    assert price(lengths, least_padding(lengths, max_batch, call_cost), call_cost) == best


@given(lengths_strategy)
def test_free_calls_pad_nothing(lengths: list[int]) -> None:
    for batch in least_padding(lengths, 32, 0):
        assert len({lengths[i] for i in batch}) == 1


@given(lengths_strategy, st.integers(1, 33))
def test_dear_calls_make_the_fewest_batches(lengths: list[int], max_batch: int) -> None:
    batches = least_padding(lengths, max_batch, 10**9)
    assert len(batches) == math.ceil(len(lengths) / max_batch)


def test_a_short_tail_is_not_padded_to_the_long_head() -> None:
    lengths = [256] * 20 + [40] * 12
    batches = least_padding(lengths, 32, 64)
    assert [sorted({lengths[i] for i in b}) for b in batches] == [[256], [40]]


def test_a_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        least_padding([1], 0, 0)
