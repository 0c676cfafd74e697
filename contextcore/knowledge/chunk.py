"""Sections into chunks, deterministically, with the embedding model's own tokenizer.

A chunk never crosses a section. Its text fills the model's window: the section's paragraphs,
joined, cut at word-piece boundaries into windows that overlap by ``overlap`` tokens, so the
first chunk of a passage is what the model would see of the whole passage. (Whole paragraphs
packed up to the window left a chunk short wherever the next paragraph did not fit: measured,
it lost recall against embedding the whole passage; docs/knowledge.md.)

Only the text is embedded. The heading path (the document title first) is kept beside it:
stored, shown, and weighed by the full-text side of the search. Embedded with the text, titles
and headings lowered recall on both quality sets, most where a title carries no meaning.

A chunk is bounded in characters too (:attr:`ChunkSettings.max_chars`), and so is its heading
path (:data:`MAX_HEADING_CHARS`): a word piece has no length of its own (a word the vocabulary
does not know, over 100 characters, is one unknown piece of any length), so a window of word
pieces alone could hold a 100,000-character word that no batch and no encoder should carry.
Real text never reaches the bound: on both quality sets (12,272 chunks) the longest chunk of a
256-piece window held 1,369 characters, 6.8 characters per piece at most, under the bound's 8.

Text is tokenized in segments of at most :data:`SEGMENT_CHARS` characters, cut at a space: the
tokenizer's memory grows with its input (about 270 bytes per piece), and a section may hold a
whole document, two million pieces of it; at once, that aborted the extraction process.

Ordinals count chunks from 0 in document order. The same sections, tokenizer and settings give
the same chunks, byte for byte, so a redelivered or retried document re-creates the same keys.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from contextcore.knowledge.extract import (
    HEADING_SEPARATOR,
    MAX_HEADING_CHARS,
    ExtractionError,
    Section,
)
from schemas.upload import MAX_CHUNK_CHARS

if TYPE_CHECKING:
    from tokenizers import Encoding

MAX_HEADING_TOKENS = 128
"""A longer heading path is cut: it is context, not text; so is one longer than
:data:`MAX_HEADING_CHARS` (the wire carries 4,000: ``MAX_SECTION_CHARS``)."""
CHARS_PER_TOKEN = 8
"""A chunk holds at most this many characters per word piece of its window (see above)."""
SEGMENT_CHARS = 16_384
"""The most characters tokenized at once."""
_SPACE_SEARCH = 1_024
"""How far back from a segment's end a space is looked for (else the segment cuts a word)."""


class Tokenizer(Protocol):
    def count(self, text: str) -> int:
        """Word pieces of ``text``, without the model's special tokens."""

    def windows(self, text: str, size: int, overlap: int, max_chars: int) -> list[str]:
        """``text`` cut at word-piece boundaries into pieces of at most ``size`` word pieces
        and ``max_chars`` characters, each starting ``size - overlap`` word pieces after the
        previous one (fewer when the characters bound a piece)."""


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

    @property
    def max_chars(self) -> int:
        """The most characters a chunk holds: :data:`CHARS_PER_TOKEN` per piece of the window,
        at most the wire's :data:`~schemas.upload.MAX_CHUNK_CHARS`."""
        return min(CHARS_PER_TOKEN * self.max_tokens, MAX_CHUNK_CHARS)


TOO_MANY_PASSAGES = "the document makes more than"
"""How the reason of a document over the chunk limit begins (it crosses the sandbox as text)."""


def chunk(
    title: str,
    sections: list[Section],
    tokenizer: Tokenizer,
    settings: ChunkSettings,
    *,
    max_chunks: int | None = None,
) -> list[Chunk]:
    """The chunks of a document, in order.

    Raises:
        ExtractionError: the document makes more than ``max_chunks`` (it stops at the first
            one over).
    """
    chunks: list[Chunk] = []
    budget = settings.max_tokens - settings.special_tokens
    for section in sections:
        path = section.path
        if path and path[0].casefold() == title.casefold():
            path = path[1:]  # a document whose first heading is its title says it once
        heading = _heading(HEADING_SEPARATOR.join(p for p in (title, *path) if p), tokenizer)
        text = " ".join(p for p in section.paragraphs if p)
        if not text:
            continue
        for body in tokenizer.windows(text, budget, settings.overlap, settings.max_chars):
            if max_chunks is not None and len(chunks) == max_chunks:
                raise ExtractionError(
                    f"{TOO_MANY_PASSAGES} {max_chunks:,} passages (the limit of one "
                    "document): split it"
                )
            tokens = tokenizer.count(body) + settings.special_tokens
            chunks.append(Chunk(len(chunks), heading, body, tokens))
    return chunks


def _heading(heading: str, tokenizer: Tokenizer) -> str:
    """The heading path cut to :data:`MAX_HEADING_CHARS` characters (at a space, when one is
    near the end), then to :data:`MAX_HEADING_TOKENS` pieces."""
    if len(heading) > MAX_HEADING_CHARS:
        cut = heading.rfind(" ", MAX_HEADING_CHARS - 100, MAX_HEADING_CHARS + 1)
        heading = heading[: cut if cut > 0 else MAX_HEADING_CHARS].rstrip()
    if tokenizer.count(heading) > MAX_HEADING_TOKENS:
        heading = tokenizer.windows(heading, MAX_HEADING_TOKENS, 0, MAX_HEADING_CHARS)[0]
    return heading


class WordPieceTokenizer:
    """The tokenizer of a Hugging Face model directory (``tokenizer.json``), through the
    ``tokenizers`` library alone: the upload consumer chunks without loading the model."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self._tokenizer = HfTokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        return sum(len(self._encode(segment).ids) for _, segment in _segments(text))

    def windows(self, text: str, size: int, overlap: int, max_chars: int) -> list[str]:
        """Cut between words where it can: a cut inside a word (between its word pieces)
        makes text that tokenizes to more pieces than the window held, past the model's.

        A piece also ends before it passes ``max_chars`` characters; the next then overlaps
        it by at most a quarter of its pieces, so a text of long words still moves on by
        whole pieces. A single piece longer than ``max_chars`` (an unknown word) is cut into
        slices of ``max_chars`` characters."""
        starts, ends, word_starts = self._pieces(text)
        count = len(starts)
        if count <= size and len(text) <= max_chars:
            return [text]

        def starts_a_word(i: int) -> bool:
            return i >= count or word_starts[i] == 1

        pieces: list[str] = []
        start = 0
        while start < count:
            end = min(start + size, count)
            fits = bisect_right(ends, starts[start] + max_chars, start, end)
            bounded = fits < end  # the characters end this piece before its pieces do
            end = max(fits, start + 1)
            if end < count:
                cut = end
                while cut > start + 1 and not starts_a_word(cut):
                    cut -= 1
                if cut > start + 1:  # else one word is longer than the window: cut inside it
                    end = cut
            piece = text[starts[start] : ends[end - 1]]
            if len(piece) > max_chars:  # one piece longer than the bound
                pieces.extend(piece[i : i + max_chars] for i in range(0, len(piece), max_chars))
            else:
                pieces.append(piece)
            if end == count:
                break
            kept = min(overlap, (end - start) // 4) if bounded else overlap
            following = max(end - kept, start + 1)
            while following < end and not starts_a_word(following):
                following += 1
            start = following
        return [p.strip() for p in pieces if p.strip()]

    def _encode(self, text: str) -> Encoding:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _pieces(self, text: str) -> tuple[array[int], array[int], bytearray]:
        """Each word piece's first and last character (end exclusive) in ``text``, and whether
        it starts a word; tokenized a segment at a time, in compact arrays."""
        starts: array[int] = array("q")
        ends: array[int] = array("q")
        word_starts = bytearray()
        for offset, segment in _segments(text):
            encoding = self._encode(segment)
            previous: int | None = -1  # a segment starts a word: it is cut at a space
            for (first, last), word in zip(encoding.offsets, encoding.word_ids, strict=True):
                starts.append(offset + first)
                ends.append(offset + last)
                word_starts.append(1 if word is None or word != previous else 0)
                previous = word
        return starts, ends, word_starts


def _segments(text: str) -> Iterator[tuple[int, str]]:
    """``text`` in pieces of at most :data:`SEGMENT_CHARS` characters with their offsets, each
    cut after a whitespace character when one is near its end (a word the tokenizer sees whole
    then; a word longer than the search is cut)."""
    start = 0
    while start < len(text):
        stop = min(start + SEGMENT_CHARS, len(text))
        if stop < len(text):
            for i in range(stop - 1, max(stop - _SPACE_SEARCH, start), -1):
                if text[i].isspace():
                    stop = i + 1
                    break
        yield start, text[start:stop]
        start = stop


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
