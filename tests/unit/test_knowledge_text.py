"""Extraction and chunking: pure functions over real parsers and the model's own tokenizer."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.chunk import (
    MAX_HEADING_TOKENS,
    SEGMENT_CHARS,
    ChunkSettings,
    WordPieceTokenizer,
    chunk,
)
from contextcore.knowledge.extract import (
    MAX_HEADING_CHARS,
    ExtractionError,
    Limits,
    Section,
    extract,
)
from tests.documents import bomb_pdf, corrupt_pdf, encrypted_pdf, text_pdf

TOKENIZER = WordPieceTokenizer(default_model_path(DEFAULT_MODEL))
WINDOW = ChunkSettings(max_tokens=256, overlap=32)


def test_markdown_keeps_its_heading_path() -> None:
    sections = extract(
        b"# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n### On Debian\n\nUse apt.\n\n## Use\n\nGo.",
        "text/markdown",
    )
    assert [(s.path, s.paragraphs) for s in sections] == [
        (("Guide",), ["Intro."]),
        (("Guide", "Install"), ["Run it."]),
        (("Guide", "Install", "On Debian"), ["Use apt."]),
        (("Guide", "Use"), ["Go."]),
    ]


def test_html_drops_scripts_and_follows_headings() -> None:
    html = (
        b"<html><head><title>t</title><script>evil()</script></head><body>"
        b"<h1>Refunds</h1><p>Within <b>30</b> days.</p><ul><li>One</li><li>Two</li></ul>"
        b"<h2>Late</h2><p>None.</p><style>p{}</style></body></html>"
    )
    sections = extract(html, "text/html; charset=utf-8")
    assert [(s.path, s.paragraphs) for s in sections] == [
        (("Refunds",), ["Within 30 days.", "One", "Two"]),
        (("Refunds", "Late"), ["None."]),
    ]


def test_plain_text_paragraphs_and_control_characters() -> None:
    sections = extract(b"first\x00 line\n\n\n second\tpara\r\n\r\nthird", "text/plain")
    assert sections == [Section((), ["first line", "second para", "third"])]


def test_pdf_pages_become_sections() -> None:
    sections = extract(
        text_pdf("Refunds take 30 days.", "Support is open weekdays."), "application/pdf"
    )
    assert [s.path for s in sections] == [("Page 1",), ("Page 2",)]
    assert "Refunds take 30 days." in sections[0].paragraphs[0]


@pytest.mark.parametrize(
    ("data", "media_type", "reason"),
    [
        (b"\x89PNG\r\n", "image/png", "is not readable"),
        (b"   \n\n  ", "text/plain", "no text"),
        (b"\xff\xfe bad", "text/plain", "not UTF-8"),
        (corrupt_pdf(), "application/pdf", "cannot be read"),
        (encrypted_pdf(), "application/pdf", "encrypted"),
        (b"x" * 20_000, "text/plain", "over the 10000-byte limit"),
    ],
)
def test_what_cannot_become_text_fails_with_the_reason(
    data: bytes, media_type: str, reason: str
) -> None:
    with pytest.raises(ExtractionError, match=reason):
        extract(data, media_type, Limits(max_bytes=10_000))


def test_a_decompression_bomb_stops_at_the_parser_limit() -> None:
    with pytest.raises(ExtractionError, match=r"Limit reached while decompressing"):
        extract(bomb_pdf(), "application/pdf")


def test_the_text_limit_stops_extraction() -> None:
    with pytest.raises(ExtractionError, match="100-character limit"):
        extract(b"word " * 100, "text/plain", Limits(max_chars=100))


def test_a_chunk_carries_its_section_and_never_crosses_it() -> None:
    sections = [
        Section(("Pricing",), ["Team costs 20 euros."]),
        Section(("Refunds",), ["30 days."]),
    ]
    chunks = chunk("Handbook", sections, TOKENIZER, WINDOW)
    assert [(c.ordinal, c.section, c.text) for c in chunks] == [
        (0, "Handbook > Pricing", "Team costs 20 euros."),
        (1, "Handbook > Refunds", "30 days."),
    ]


def test_a_chunk_fills_the_window_across_paragraphs() -> None:
    """The first chunk is what the model would see of the whole passage: a paragraph that does
    not fit whole is cut, not pushed to the next chunk."""
    first = " ".join(f"alpha{i}" for i in range(60))
    second = " ".join(f"beta{i}" for i in range(200))
    chunks = chunk("Doc", [Section((), [first, second])], TOKENIZER, WINDOW)
    assert chunks[0].text.startswith(first + " beta0")
    assert chunks[0].tokens >= WINDOW.max_tokens - 8
    assert chunks[-1].text.endswith("beta199")


def test_a_window_never_ends_inside_a_word() -> None:
    """A cut between a word's pieces re-tokenized to more pieces than the window (git's manual
    pages failed to ingest: "the extraction process answered nonsense")."""
    words = ["internationalization", "refactorings", "unambiguously", "git-rev-parse(1)"]
    text = " ".join(words[i % len(words)] + str(i) for i in range(2_000))
    chunks = chunk("Doc", [Section((), [text])], TOKENIZER, WINDOW)
    assert len(chunks) > 10
    assert all(c.tokens <= WINDOW.max_tokens for c in chunks)
    whole = set(re.findall(r"\w+", text))
    for c in chunks:  # the runs of letters a chunk starts and ends with are whole ones
        runs = re.findall(r"\w+", c.text)
        assert {runs[0], runs[-1]} <= whole, (runs[0], runs[-1])


def test_long_text_is_cut_within_the_window_with_overlap() -> None:
    paragraph = " ".join(f"sentence{i} about the refund policy." for i in range(400))
    chunks = chunk("Doc", [Section(("Long",), [paragraph])], TOKENIZER, WINDOW)
    assert len(chunks) > 3
    assert all(c.tokens <= WINDOW.max_tokens for c in chunks)
    for before, after in itertools.pairwise(chunks):
        tail = before.text.split()[-5:]
        assert " ".join(tail) in after.text, "consecutive windows overlap"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.text(min_size=1, max_size=400), min_size=1, max_size=6),
        min_size=1,
        max_size=5,
    )
)
def test_chunking_is_deterministic_and_bounded(paragraphs: list[list[str]]) -> None:
    sections = [Section((f"s{i}",), p) for i, p in enumerate(paragraphs)]
    first = chunk("T", sections, TOKENIZER, WINDOW)
    assert first == chunk("T", sections, TOKENIZER, WINDOW)
    assert [c.ordinal for c in first] == list(range(len(first)))
    assert all(c.tokens <= WINDOW.max_tokens for c in first)


def test_a_word_longer_than_a_chunk_is_cut_into_bounded_chunks() -> None:
    """A word the vocabulary does not know is one word piece of any length: a 100,000-character
    word made one chunk too long for any batch (issue 32). Characters bound a chunk too."""
    chunks = chunk("Doc", [Section((), ["a" * 100_000 + " end"])], TOKENIZER, WINDOW)
    assert all(len(c.text) <= WINDOW.max_chars for c in chunks)
    assert "".join(c.text for c in chunks).replace(" ", "") == "a" * 100_000 + "end"


def test_long_words_fill_chunks_by_characters_and_move_on() -> None:
    """1.9 MB of 150-character words: chunks bounded in characters, each overlapping the one
    before by a few words only (an overlap of 32 pieces would start every chunk one word on)."""
    words = [f"{i:05d}" + "w" * 145 for i in range(2_000)]
    chunks = chunk("Doc", [Section((), [" ".join(words)])], TOKENIZER, WINDOW)
    assert all(len(c.text) <= WINDOW.max_chars for c in chunks)
    assert len(chunks) < len(words) / 8
    assert {w for c in chunks for w in c.text.split()} == set(words)


def test_a_heading_path_is_bounded_in_characters() -> None:
    for path in (("h" * 5_000,), ("heading " * 700,), tuple(f"part {i}" for i in range(900))):
        (only,) = chunk("Doc", [Section(path, ["body"])], TOKENIZER, WINDOW)
        assert 0 < len(only.section) <= MAX_HEADING_CHARS
        assert TOKENIZER.count(only.section) <= MAX_HEADING_TOKENS


def test_a_text_is_tokenized_in_segments_as_it_would_be_whole() -> None:
    """Segments are cut at a space, so the pieces are the whole text's: the chunks of a long
    section are the chunks it had when it was tokenized at once (and its memory is bounded)."""
    text = " ".join(f"word{i % 97} of the handbook, line {i}." for i in range(12_000))
    assert len(text) > 4 * SEGMENT_CHARS
    whole = TOKENIZER._tokenizer.encode(text, add_special_tokens=False)
    starts, ends, _ = TOKENIZER._pieces(text)
    assert list(zip(starts, ends, strict=True)) == whole.offsets
    assert TOKENIZER.count(text) == len(whole.ids)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=300)
        | st.integers(1, 3_000).map(lambda n: "x" * n),
        min_size=1,
        max_size=30,
    )
)
def test_every_chunk_is_bounded_in_pieces_and_characters(words: list[str]) -> None:
    chunks = chunk("T", [Section(("s",), [" ".join(words)])], TOKENIZER, WINDOW)
    assert all(0 < len(c.text) <= WINDOW.max_chars for c in chunks)
    assert all(c.tokens <= WINDOW.max_tokens for c in chunks)
    assert all(len(c.section) <= MAX_HEADING_CHARS for c in chunks)


def test_a_document_makes_at_most_max_chunks_and_stops_at_the_first_over() -> None:
    sections = [Section(("h",), [f"w{i}"]) for i in range(50)]
    assert len(chunk("T", sections, TOKENIZER, WINDOW, max_chunks=50)) == 50
    with pytest.raises(ExtractionError, match="more than 49 passages"):
        chunk("T", sections, TOKENIZER, WINDOW, max_chunks=49)
