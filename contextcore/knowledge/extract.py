"""Text out of an uploaded document, along its structure: plain text, Markdown, HTML and PDF.

Every format goes through a maintained parser (markdown-it-py, BeautifulSoup with the standard
library's HTML parser, pypdf); nothing here parses a format by hand. The result is a list of
:class:`Section`: a heading path (``("Install", "On Debian")``) and the paragraphs under it,
which the chunker packs without ever crossing a section.

Bounded: the input is refused above ``max_bytes``, extraction stops with an error once the text
passes ``max_chars``, a PDF above ``max_pages`` is refused before its pages are read, and pypdf's
own decompression limits stop a stream that inflates without end. A type it cannot read, an empty
text, an encrypted or corrupt PDF: each is an :class:`ExtractionError` whose message is the
reason a failed source shows. pypdf's inflate limits are lowered to ``max_stream_bytes`` for
each stream, so a decompression bomb fails instead of filling memory.
"""

from __future__ import annotations

import io
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from contextcore.errors import ContextcoreError

PLAIN = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
PDF = "application/pdf"
MEDIA_TYPES = (PLAIN, MARKDOWN, HTML, PDF)
_ALIASES = {"text/x-markdown": MARKDOWN, "application/xhtml+xml": HTML}

_SPACE = re.compile(r"\s+")
_BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")
_CONTROL = {c: " " for c in range(32) if chr(c) not in "\n\t"} | {0x7F: " "}


class ExtractionError(ContextcoreError):
    """The document cannot become text; the message is the failed source's reason."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 20_000_000
    max_chars: int = 2_000_000
    max_pages: int = 2_000
    max_stream_bytes: int = 25_000_000
    """What one compressed PDF stream may inflate to (pypdf's own default is 75 MB)."""


@dataclass
class Section:
    path: tuple[str, ...]
    paragraphs: list[str] = field(default_factory=list)


def media_type_of(declared: str) -> str:
    """The canonical media type of a declared one (parameters such as ``charset`` dropped)."""
    base = declared.split(";", 1)[0].strip().lower()
    return _ALIASES.get(base, base)


def clean(text: str) -> str:
    """One paragraph as one line: NUL and other control characters and every run of whitespace
    become one space; NFC so that equal text is equal bytes."""
    if not text.isascii():  # a lone surrogate (a PDF can decode to one) becomes U+FFFD
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text.translate(_CONTROL))).strip()


def extract(data: bytes, media_type: str, limits: Limits = Limits()) -> list[Section]:
    """The sections of a document, in document order; never empty.

    Raises:
        ExtractionError: why the document yields no text.
    """
    kind = media_type_of(media_type)
    if kind not in MEDIA_TYPES:
        raise ExtractionError(
            f"media type {media_type[:100]!r} is not readable (readable: {', '.join(MEDIA_TYPES)})"
        )
    if len(data) > limits.max_bytes:
        raise ExtractionError(
            f"the document is {len(data)} bytes, over the {limits.max_bytes}-byte limit"
        )
    budget = _Budget(limits.max_chars)
    if kind == PDF:
        sections = _pdf(data, limits, budget)
    else:
        text = _decode(data)
        if kind == MARKDOWN:
            sections = _markdown(text, budget)
        elif kind == HTML:
            sections = _html(text, budget)
        else:
            sections = [Section((), list(budget.take(_paragraphs(text))))]
    sections = [s for s in sections if s.paragraphs]
    if not sections:
        raise ExtractionError("the document has no text")
    return sections


class _Budget:
    """Counts extracted characters and stops extraction past the limit."""

    def __init__(self, max_chars: int) -> None:
        self.left = max_chars
        self.limit = max_chars

    def take(self, paragraphs: Iterable[str]) -> Iterator[str]:
        for raw in paragraphs:
            text = clean(raw)
            if not text:
                continue
            self.left -= len(text)
            if self.left < 0:
                raise ExtractionError(
                    f"the text passes the {self.limit}-character limit; split the document"
                )
            yield text


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ExtractionError(f"the text is not UTF-8 (byte {error.start})") from error


def _paragraphs(text: str) -> list[str]:
    return _BLANK_LINES.split(text.replace("\r\n", "\n").replace("\r", "\n"))


def _markdown(text: str, budget: _Budget) -> list[Section]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    sections = [Section(())]
    headings: list[tuple[int, str]] = []
    pending_heading: int | None = None
    for token in tokens:
        if token.type == "heading_open":
            pending_heading = int(token.tag[1:])
        elif token.type == "inline" and pending_heading is not None:
            title = clean(token.content)
            headings = [(level, t) for level, t in headings if level < pending_heading]
            headings.append((pending_heading, title))
            sections.append(Section(tuple(t for _, t in headings)))
            pending_heading = None
        elif token.type == "inline" or (token.type in {"fence", "code_block"} and token.content):
            sections[-1].paragraphs.extend(budget.take([token.content]))
    return sections


_BLOCKS = ("p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption", "caption")
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _html(text: str, budget: _Budget) -> list[Section]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(text, "html.parser")
    for hidden in soup(["script", "style", "noscript", "template", "head"]):
        hidden.decompose()
    sections = [Section(())]
    headings: list[tuple[int, str]] = []
    for element in soup.find_all([*_HEADINGS, *_BLOCKS]):
        if element.find_parent(_BLOCKS) is not None:
            continue  # a block inside a block: its text is in the outer one
        if element.name in _HEADINGS:
            level = int(element.name[1])
            headings = [(lv, t) for lv, t in headings if lv < level]
            headings.append((level, clean(element.get_text(" "))))
            sections.append(Section(tuple(t for _, t in headings)))
        else:
            sections[-1].paragraphs.extend(budget.take([element.get_text(" ")]))
    if not any(s.paragraphs for s in sections):  # no block markup at all: the body's text
        body = soup.body or soup
        sections = [Section((), list(budget.take(_paragraphs(body.get_text("\n")))))]
    return sections


def _pdf(data: bytes, limits: Limits, budget: _Budget) -> list[Section]:
    from pypdf import apply_configuration

    inflate = limits.max_stream_bytes
    with apply_configuration(
        zlib_maximum_output_length=inflate,
        lzw_maximum_output_length=inflate,
        run_length_maximum_output_length=inflate,
        brotli_maximum_output_length=inflate,
        array_based_stream_maximum_output_length=inflate,
        image_maximum_buffer_size=inflate,
    ):
        return _pdf_pages(data, limits, budget)


def _pdf_pages(data: bytes, limits: Limits, budget: _Budget) -> list[Section]:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise ExtractionError("the PDF is encrypted")
        pages = len(reader.pages)
        if pages > limits.max_pages:
            raise ExtractionError(f"the PDF has {pages} pages, over the {limits.max_pages} limit")
        sections = []
        for number, page in enumerate(reader.pages, start=1):
            text = page.extract_text() or ""
            sections.append(Section((f"Page {number}",), list(budget.take(_paragraphs(text)))))
        return sections
    except ExtractionError:
        raise
    except FileNotDecryptedError as error:
        raise ExtractionError("the PDF is encrypted") from error
    except PyPdfError as error:
        raise ExtractionError(f"the PDF cannot be read: {type(error).__name__}: {error}") from error
    except Exception as error:  # a corrupt file breaks pypdf in ways it does not wrap
        raise ExtractionError(f"the PDF cannot be read: {type(error).__name__}: {error}") from error
