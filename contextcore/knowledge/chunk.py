"""Sections into chunks, deterministically, with the embedding model's own tokenizer.

A chunk never crosses a section: it is the section's heading path (with the document title in
front) and as many whole paragraphs as fit in the model's window. The heading goes into the text
that is embedded, because a passage alone often does not say what question it answers (blind
fixed-size windows lost R@10 on our quality set; docs/knowledge.md). A paragraph longer than the
window is cut at word-piece boundaries into windows that overlap by ``overlap`` tokens; packed
paragraphs overlap too: a new chunk of the same section starts with the previous chunk's last
paragraph when that paragraph is at most ``overlap`` tokens.

Ordinals count chunks from 0 in document order. The same sections, tokenizer and settings give
the same chunks, byte for byte, so a redelivered or retried document re-creates the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contextcore.knowledge.extract import Section

HEADING_SEPARATOR = " > "


class Tokenizer(Protocol):
    def count(self, text: str) -> int:
        """Word pieces of ``text``, without the model's special tokens."""

    def windows(self, text: str, size: int, overlap: int) -> list[str]:
        """``text`` cut at word-piece boundaries into pieces of at most ``size`` word pieces,
        each starting ``size - overlap`` word pieces after the previous one."""


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    section: str
    """The heading path, the document title first: stored, and embedded with the text."""
    text: str
    """The passage itself: what a brief shows."""
    tokens: int
    """Word pieces of :attr:`embedded` (the window the model sees, special tokens included)."""

    @property
    def embedded(self) -> str:
        return f"{self.section}\n{self.text}" if self.section else self.text


@dataclass(frozen=True)
class ChunkSettings:
    max_tokens: int = 256
    """The model's window in word pieces, its special tokens included (all-MiniLM-L6-v2: 256)."""
    overlap: int = 32
    special_tokens: int = 2

    def __post_init__(self) -> None:
        if self.max_tokens < 32:
            raise ValueError("max_tokens must be at least 32")
        if not 0 <= self.overlap < self.max_tokens // 2:
            raise ValueError("overlap must be non-negative and under half of max_tokens")


def chunk(
    title: str, sections: list[Section], tokenizer: Tokenizer, settings: ChunkSettings
) -> list[Chunk]:
    """The chunks of a document, in order."""
    chunks: list[Chunk] = []
    for section in sections:
        path = section.path
        if path and path[0].casefold() == title.casefold():
            path = path[1:]  # a document whose first heading is its title says it once
        heading = HEADING_SEPARATOR.join(part for part in (title, *path) if part)
        # the heading's own pieces, the newline and the specials come out of the window; a
        # heading that leaves less than half the window is cut short (it is context, not text)
        room = settings.max_tokens - settings.special_tokens - 1
        if tokenizer.count(heading) > room // 2:
            heading = tokenizer.windows(heading, room // 2, 0)[0]
        budget = room - tokenizer.count(heading)
        for body in _pack(section.paragraphs, tokenizer, budget, settings.overlap):
            text = f"{heading}\n{body}" if heading else body
            tokens = tokenizer.count(text) + settings.special_tokens
            chunks.append(Chunk(len(chunks), heading, body, tokens))
    return chunks


def _pack(paragraphs: list[str], tokenizer: Tokenizer, budget: int, overlap: int) -> list[str]:
    """Whole paragraphs joined up to ``budget`` word pieces; a longer one cut into windows."""
    pieces: list[tuple[str, int]] = []
    for paragraph in paragraphs:
        size = tokenizer.count(paragraph)
        if size <= budget:
            pieces.append((paragraph, size))
        else:
            for window in tokenizer.windows(paragraph, budget, overlap):
                pieces.append((window, tokenizer.count(window)))
    bodies: list[str] = []
    current: list[tuple[str, int]] = []
    used = 0
    for text, size in pieces:
        if current and used + size + 1 > budget:
            bodies.append(" ".join(t for t, _ in current))
            last_text, last_size = current[-1]
            carried = last_size <= overlap and last_size + size + 1 <= budget
            current, used = ([(last_text, last_size)], last_size) if carried else ([], 0)
        current.append((text, size))
        used += size + (1 if len(current) > 1 else 0)
    if current:
        bodies.append(" ".join(t for t, _ in current))
    return bodies


class WordPieceTokenizer:
    """The tokenizer of a Hugging Face model directory (``tokenizer.json``), through the
    ``tokenizers`` library alone: the upload consumer chunks without loading the model."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self._tokenizer = HfTokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def windows(self, text: str, size: int, overlap: int) -> list[str]:
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= size:
            return [text]
        step = max(size - overlap, 1)
        pieces = []
        for start in range(0, len(offsets), step):
            end = min(start + size, len(offsets))
            pieces.append(text[offsets[start][0] : offsets[end - 1][1]].strip())
            if end == len(offsets):
                break
        return [p for p in pieces if p]
