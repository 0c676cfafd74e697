"""Our encoders embed as sentence-transformers does: the light query encoder (OpenVINO runtime,
no torch), and the full one, which cuts its own batches by word pieces."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contextcore.knowledge.adapters.encoder import (
    DEFAULT_MODEL,
    LENGTH_STEP,
    OpenVinoQueryEncoder,
    SentenceTransformerEncoder,
)
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.encoding import Encoder
from tests.integration.helpers import status_mb

pytestmark = pytest.mark.integration

TEXTS = [
    "how do I get a refund?",
    "Handbook > Refunds\nA customer may cancel within 30 days and receive a full refund.",
    "word " * 400,  # past the window: both cut it at 256 word pieces
    "Ünïcödé, 中文, emoji 🙂",
]


def test_the_light_query_encoder_equals_the_full_one(encoder: Encoder, model_cache: Path) -> None:
    path = KnowledgeSettings.model_construct().path()
    light = OpenVinoQueryEncoder(DEFAULT_MODEL, path, model_cache)
    assert (light.model, light.dimensions) == (encoder.model, encoder.dimensions)
    full = np.asarray(encoder.encode(TEXTS))
    ours = np.asarray(light.encode(TEXTS))
    assert (full * ours).sum(axis=1).min() > 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert light.encode([]) == []


def test_batches_cut_by_word_pieces_embed_as_sentence_transformers_does(encoder: Encoder) -> None:
    assert isinstance(encoder, SentenceTransformerEncoder)
    # mixed lengths in a shuffled order, more than one batch: the vectors come back in order
    texts = [f"{'refund policy ' * (i * 7 % 150)}item {i}" for i in range(70)] + TEXTS
    ours = np.asarray(encoder.encode(texts))
    plain = encoder.sentence_transformer.encode(texts, batch_size=32, normalize_embeddings=True)
    assert ours.shape == plain.shape
    assert (ours * plain).sum(axis=1).min() > 0.9999


def test_the_model_runs_at_few_shapes(encoder: Encoder) -> None:
    """Batches reach the model padded to a length step and at a power-of-two size, whatever the
    lengths of the texts: a new shape is a kernel compile (encoder.LENGTH_STEP)."""
    assert isinstance(encoder, SentenceTransformerEncoder)
    rng = random.Random(3)
    texts = [" ".join(["refund"] * rng.randint(1, 300)) for _ in range(75)]
    seen: list[tuple[int, int]] = []

    def record(module: object, args: tuple[dict[str, Any], ...]) -> None:
        rows, width = args[0]["input_ids"].shape
        seen.append((int(rows), int(width)))

    handle = encoder.sentence_transformer[0].register_forward_pre_hook(record)
    try:
        vectors = encoder.encode(texts)
    finally:
        handle.remove()
    assert sum(rows for rows, _ in seen) == len(vectors) == 75
    for rows, width in seen:
        assert rows in (1, 2, 4, 8, 16, 32)
        assert width % LENGTH_STEP == 0
        assert width <= encoder.max_seq_length


def test_loading_the_encoder_says_nothing(
    model_cache: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A consumer's start says it is ready and nothing else: no warning from the libraries on
    loading the exported model (optimum's cache probe printed two lines on every start)."""
    settings = KnowledgeSettings.model_construct(cache_dir=model_cache)
    settings.load_encoder()  # the export, if no test made it yet
    capfd.readouterr()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        settings.load_encoder()
    assert [r.getMessage() for r in caplog.records] == []
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(600)  # 900 encodes: about 40 s on a quiet machine, minutes on a busy one
def test_the_encoder_memory_levels_off_over_inputs_of_every_shape(encoder: Encoder) -> None:
    """Documents come in every length, and OpenVINO keeps kernels per input shape: unbounded,
    900 calls of random shapes grew this process by about 230 MB after the first 300 (and it
    kept climbing); with the cache bounded (encoder.OPENVINO_CONFIG), by about 25 MB."""
    rng = random.Random(11)
    words = [
        "refund",
        "policy",
        "support",
        "invoice",
        "shipping",
        "account",
        "billing",
        "order",
        "team",
    ]

    def calls(count: int) -> None:
        for _ in range(count):
            size = rng.randint(1, 3)
            encoder.encode(
                [" ".join(rng.choices(words, k=rng.randint(5, 240))) for _ in range(size)]
            )

    calls(300)
    warm = status_mb("self", "VmRSS")
    calls(600)
    assert status_mb("self", "VmRSS") - warm < 100
