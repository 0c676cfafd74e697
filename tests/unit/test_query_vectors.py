"""The knowledge source's query vectors: questions of builds in flight share one encode, and a
repeated question of the same organization costs none; another organization's never answers."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence

import pytest

from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.encoding import Encoder


class Counting:
    model = "m"
    dimensions = 2

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.release.set()

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        self.release.wait(5)
        return [[float(len(t)), 0.5] for t in texts]


def vectors_of(encoder: Counting, **kwargs: int) -> QueryVectors:
    async def encoders(model: str) -> Encoder:
        if model != "m":
            raise KeyError(model)
        return encoder

    return QueryVectors(encoders, **kwargs)


async def test_a_repeated_question_of_one_organization_costs_no_encode() -> None:
    encoder = Counting()
    vectors = vectors_of(encoder)
    a, b = uuid.uuid4(), uuid.uuid4()
    first = await vectors.vector(a, "m", "when is the renewal?")
    assert await vectors.vector(a, "m", "when is the renewal?") == first
    assert encoder.calls == [["when is the renewal?"]]
    assert await vectors.vector(b, "m", "when is the renewal?") == first  # same text, same vector
    assert len(encoder.calls) == 2  # but never from another organization's entry
    assert (vectors.hits, vectors.misses, len(vectors)) == (1, 2, 2)


async def test_questions_in_flight_share_one_encode() -> None:
    encoder = Counting()
    encoder.release.clear()
    vectors = vectors_of(encoder)
    org = uuid.uuid4()
    first = asyncio.create_task(vectors.vector(org, "m", "a"))
    await asyncio.sleep(0.05)  # the first encode runs; the next three wait behind it
    rest = [asyncio.create_task(vectors.vector(org, "m", t)) for t in ("bb", "ccc", "dddd")]
    await asyncio.sleep(0.05)
    encoder.release.set()
    got = await asyncio.gather(first, *rest)
    assert got == ["[1,0.5]", "[2,0.5]", "[3,0.5]", "[4,0.5]"]
    assert encoder.calls == [["a"], ["bb", "ccc", "dddd"]]


async def test_it_is_bounded_and_an_unknown_model_is_a_key_error() -> None:
    encoder = Counting()
    vectors = vectors_of(encoder, max_entries=2)
    org = uuid.uuid4()
    for text in ("one", "two", "three"):
        await vectors.vector(org, "m", text)
    assert len(vectors) == 2
    await vectors.vector(org, "m", "one")  # the oldest went: encoded again
    assert encoder.calls[-1] == ["one"]
    with pytest.raises(KeyError):
        await vectors.vector(org, "other", "one")
