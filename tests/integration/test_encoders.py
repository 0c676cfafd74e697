"""Our encoders embed as sentence-transformers does: the light query encoder (OpenVINO runtime,
no torch), and the full one, which cuts its own batches by word pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contextcore.knowledge.encoder import (
    DEFAULT_MODEL,
    Encoder,
    OpenVinoQueryEncoder,
    SentenceTransformerEncoder,
)
from contextcore.knowledge.settings import KnowledgeSettings

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
