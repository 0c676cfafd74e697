"""``python -m contextcore.knowledge.adapters.export MODEL_DIR CACHE_DIR``: export a model to
OpenVINO into the cache (what
:class:`~contextcore.knowledge.adapters.encoder.SentenceTransformerEncoder` does on first load),
in a process of its own so the caller never imports torch."""

from __future__ import annotations

import sys
from pathlib import Path

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, SentenceTransformerEncoder


def main(argv: list[str]) -> int:
    model_dir, cache_dir = Path(argv[0]), Path(argv[1])
    encoder = SentenceTransformerEncoder(
        DEFAULT_MODEL, model_dir, backend="openvino", cache_dir=cache_dir
    )
    return 0 if encoder.backend == "openvino" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
