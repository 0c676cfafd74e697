"""Sections into chunks, deterministically, with the embedding model's own tokenizer.

A chunk never crosses a section. Its text fills the model's window: the section's paragraphs,
joined, cut at word-piece boundaries into windows that overlap by ``overlap`` tokens, so the
first chunk of a passage is what the model would see of the whole passage. (Whole paragraphs
packed up to the window left a chunk short wherever the next paragraph did not fit: measured,
it lost recall against embedding the whole passage; docs/knowledge.md.)

Only the text is embedded. The heading path (the document title first) is kept beside it:
stored, shown, and weighed by the full-text side of the search. Embedded with the text, titles
and headings lowered recall on both quality sets, most where a title carries no meaning.

Ordinals count chunks from 0 in document order. The same sections, tokenizer and settings give
the same chunks, byte for byte, so a redelivered or retried document re-creates the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contextcore.knowledge.extract import Section

HEADING_SEPARATOR = " > "
MAX_HEADING_TOKENS = 128
"""A longer heading path is cut: it is context, not text."""


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
    """The heading path, the document title first: stored, shown and searched as words."""
    text: str
    """The passage itself: what is embedded and what a brief shows."""
    tokens: int
    """Word pieces of :attr:`text` with the model's special tokens (what the model sees)."""


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
    budget = settings.max_tokens - settings.special_tokens
    for section in sections:
        path = section.path
        if path and path[0].casefold() == title.casefold():
            path = path[1:]  # a document whose first heading is its title says it once
        heading = HEADING_SEPARATOR.join(part for part in (title, *path) if part)
        if tokenizer.count(heading) > MAX_HEADING_TOKENS:
            heading = tokenizer.windows(heading, MAX_HEADING_TOKENS, 0)[0]
        text = " ".join(p for p in section.paragraphs if p)
        if not text:
            continue
        for body in tokenizer.windows(text, budget, settings.overlap):
            tokens = tokenizer.count(body) + settings.special_tokens
            chunks.append(Chunk(len(chunks), heading, body, tokens))
    return chunks


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
        """Cut between words where it can: a cut inside a word (between its word pieces)
        makes text that tokenizes to more pieces than the window held, past the model's."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        offsets, words = encoding.offsets, encoding.word_ids
        count = len(offsets)
        if count <= size:
            return [text]

        def starts_a_word(i: int) -> bool:
            return i >= count or words[i] is None or words[i] != words[i - 1]

        pieces = []
        start = 0
        while True:
            end = min(start + size, count)
            if end < count:
                cut = end
                while cut > start + 1 and not starts_a_word(cut):
                    cut -= 1
                if cut > start + 1:  # else one word is longer than the window: cut inside it
                    end = cut
            pieces.append(text[offsets[start][0] : offsets[end - 1][1]].strip())
            if end == count:
                break
            following = max(end - overlap, start + 1)
            while following < end and not starts_a_word(following):
                following += 1
            start = following
        return [p for p in pieces if p]


@dataclass(frozen=True)
class ModelWindow:
    """How one model cuts text: its tokenizer's folder and its window."""

    tokenizer: Path
    settings: ChunkSettings


@dataclass(frozen=True)
class Cut:
    """A document cut: its sections, and their chunks per model."""

    sections: list[Section]
    chunks: dict[str, list[Chunk]]
    """Per model, in order."""
