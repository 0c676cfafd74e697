"""The extraction worker's answer: small for a document of many sections under long headings,
and read as untrusted input (a worker a document took over may answer anything)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, default_model_path
from contextcore.knowledge.adapters.sandbox import TextSandbox
from contextcore.knowledge.adapters.worker import cut
from contextcore.knowledge.chunk import ChunkSettings, ModelWindow, WordPieceTokenizer, chunk
from contextcore.knowledge.extract import (
    HEADING_SEPARATOR,
    MAX_PATH_CHARS,
    ExtractionError,
    Limits,
    Section,
    bounded_path,
    extract,
)

MODEL_PATH = default_model_path(DEFAULT_MODEL)
TOKENIZER = WordPieceTokenizer(MODEL_PATH)
WINDOWS = {"m": ModelWindow(MODEL_PATH, ChunkSettings())}
LIMITS = Limits(max_chunks=10)


def job(text: str) -> dict[str, Any]:
    return {
        "title": "Doc",
        "media_type": "text/markdown",
        "limits": vars(Limits()),
        "models": {
            "m": {"tokenizer": str(MODEL_PATH), "max_tokens": 256, "overlap": 32},
        },
        "sections": None,
    }


def test_many_sections_under_a_long_heading_make_a_small_answer() -> None:
    """9,000 sections under a 6,000-character heading: each sent its whole path, a 54 MB answer
    of an 87 KB document (issue 32). Now each part goes once, and a path is cut where a chunk's
    heading stops using it."""
    document = "# " + "h" * 6_000 + "\n\n" + "".join(f"## s{i}\n\nw\n\n" for i in range(9_000))
    answer = cut(job(document), document.encode())
    assert answer["ok"], answer
    size = len(json.dumps(answer, ensure_ascii=False).encode())
    assert size < 1_000_000, f"an answer of {size:,} bytes for {len(document):,} characters"
    assert len(answer["sections"]) == 9_000
    assert max(len(p) for p in answer["parts"]) <= MAX_PATH_CHARS


def test_a_heading_with_no_text_goes_through_the_answer() -> None:
    document = "#\n\ntext\n\n## b\n\nmore\n"
    raw = json.dumps(cut(job(document), document.encode())).encode()
    result = TextSandbox()._parse(raw, {"m": WINDOWS["m"]}, Limits())
    assert [s.path for s in result.sections] == [("",), ("", "b")]


def test_extraction_cuts_every_path_where_a_chunk_heading_stops_using_it() -> None:
    markdown = "# " + "a" * 3_000 + "\n\n## " + "b" * 3_000 + "\n\ntext\n"
    for data, media_type in (
        (markdown, "text/markdown"),
        (f"<h1>{'a' * 3_000}</h1><h2>{'b' * 3_000}</h2><p>text</p>", "text/html"),
    ):
        (section,) = extract(data.encode(), media_type)
        assert len(HEADING_SEPARATOR.join(section.path)) <= MAX_PATH_CHARS


part = st.text(st.sampled_from("tb >"), max_size=1_100) | st.sampled_from(["", " > ", "x" * 999])


@settings(max_examples=200, deadline=None)
@given(title=st.text(st.sampled_from("t "), min_size=1, max_size=500), path=st.lists(part))
def test_a_bounded_path_makes_the_heading_the_whole_path_made(title: str, path: list[str]) -> None:
    bounded = bounded_path(path)
    assert len(HEADING_SEPARATOR.join(p for p in bounded if p)) <= MAX_PATH_CHARS
    (whole,) = chunk(title, [Section(tuple(path), ["body"])], TOKENIZER, ChunkSettings())
    (cut_,) = chunk(title, [Section(bounded, ["body"])], TOKENIZER, ChunkSettings())
    assert cut_.section == whole.section


def answer(**fields: Any) -> bytes:
    good: dict[str, Any] = {
        "ok": True,
        "sections": [[[0], ["text"]]],
        "parts": ["Intro"],
        "headings": ["Doc > Intro"],
        "chunks": {"m": [[0, 0, "text", 3]]},
    }
    return json.dumps(good | fields).encode()


def test_a_well_formed_answer_shares_its_strings() -> None:
    result = TextSandbox()._parse(answer(), WINDOWS, LIMITS)
    assert result.sections == [Section(("Intro",), ["text"])]
    assert [(c.ordinal, c.section, c.text, c.tokens) for c in result.chunks["m"]] == [
        (0, "Doc > Intro", "text", 3)
    ]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"chunks": {"m": [[0, -1, "text", 3]]}}, "chunks"),
        ({"chunks": {"m": [[0, 1, "text", 3]]}}, "chunks"),  # past the headings
        ({"chunks": {"m": [[0, 2**70, "text", 3]]}}, "chunks"),
        ({"chunks": {"m": [[0, 0, "text", 99_999]]}}, "chunks"),
        ({"chunks": {"m": [[1, 0, "text", 3]]}}, "chunks"),
        ({"chunks": {"m": [[i, 0, "t", 3] for i in range(11)]}}, "chunks"),  # over max_chunks
        ({"chunks": {"other": [[0, 0, "text", 3]]}}, "missing parts"),
        ({"headings": None}, "missing parts"),
        ({"parts": None}, "missing parts"),
        ({"sections": [[[1], ["text"]]]}, "sections"),  # past the parts
        ({"sections": [[[-1], ["text"]]]}, "sections"),
        ({"sections": [[[0], ["t"]]] * 11}, "sections"),  # over max_chunks
        ({"parts": ["x" * (MAX_PATH_CHARS + 1)]}, "problems"),
        ({"sections": [[["Intro"], ["text"]]]}, "problems"),  # the old shape
    ],
)
def test_an_answer_that_lies_fails_its_document(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ExtractionError, match=f"answered nonsense.*{problem}"):
        TextSandbox()._parse(answer(**fields), WINDOWS, LIMITS)
