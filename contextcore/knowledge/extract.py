"""Text out of an uploaded document, along its structure: plain text, Markdown, HTML and PDF.

Every format goes through a maintained parser (markdown-it-py, the standard library's HTML
parser, pypdf); nothing here parses a format by hand. Every reader is linear in its input (an
untrusted document runs in a worker process under memory and CPU limits all the same:
:mod:`~contextcore.knowledge.adapters.sandbox`). The result is a list of
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
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

from schemas.errors import ContextcoreError

PLAIN = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
PDF = "application/pdf"
MEDIA_TYPES = (PLAIN, MARKDOWN, HTML, PDF)
_ALIASES = {"text/x-markdown": MARKDOWN, "application/xhtml+xml": HTML}

HEADING_SEPARATOR = " > "
"""What joins a heading path (after the title) into a chunk's heading."""
MAX_HEADING_CHARS = 1_000
"""A chunk's heading is cut at this many characters (:mod:`~contextcore.knowledge.chunk`)."""
MAX_PATH_CHARS = MAX_HEADING_CHARS + 1 + len(HEADING_SEPARATOR)
"""A section's path, joined, is cut here: all a chunk's heading can use of it (its first 1,001
characters: the heading's cut looks one past its bound for a space), with room for the
separator the cut may fall on. Every section repeated the whole path of its ancestors, and
9,000 sections under one 6,000-character heading made a 54 MB answer of an 87 KB document
(issue 32)."""

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
    max_chunks: int = 10_000
    """Chunks of one document under one model at most: what an upload makes the consumer hold
    and the embedding group encode grows with them, and tiny sections under long headings made
    33,000 of a 300 KB document (issue 32). Prose of the largest document (2 M characters)
    makes about 2,300."""


@dataclass
class Section:
    path: tuple[str, ...]
    paragraphs: list[str] = field(default_factory=list)


def bounded_path(parts: Iterable[str]) -> tuple[str, ...]:
    """The heading path of ``parts`` whose joined form (a join skips empty parts) is theirs cut
    at :data:`MAX_PATH_CHARS`: a chunk cut from the section has the heading it had with the
    whole path. (But for a first part the chunker drops as the title's repetition that is
    longer than the title by more than the separator: ``casefold`` can lengthen a title.)"""
    kept: list[str] = []
    used = 0  # the characters of the kept parts, joined
    for part in parts:
        if not part:
            kept.append(part)
            continue
        room = MAX_PATH_CHARS - used - (len(HEADING_SEPARATOR) if used else 0)
        if room <= 0:
            break
        kept.append(part[:room])
        used = MAX_PATH_CHARS - room + len(kept[-1])
    return tuple(kept)


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
            sections.append(Section(bounded_path(t for _, t in headings)))
            pending_heading = None
        elif token.type == "inline" or (token.type in {"fence", "code_block"} and token.content):
            sections[-1].paragraphs.extend(budget.take([token.content]))
    return sections


_BLOCKS = frozenset(
    {"p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption", "caption"}
)
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_HIDDEN = frozenset({"script", "style", "noscript", "template", "head"})
_VOID = frozenset(
    {
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
        "source", "track", "wbr",
    }
)  # fmt: skip


def _html(text: str, budget: _Budget) -> list[Section]:
    """One pass of the standard library's HTML parser, linear in the input.

    The outermost block (``p``, ``li``, ``td`` …) is one paragraph with the text of every
    element inside it; a heading outside a block starts a section; text inside ``script``,
    ``style``, ``noscript``, ``template`` and ``head`` is dropped. A document with no block
    markup at all is read as plain text, paragraphs at blank lines.

    No tree is built (an earlier tree-based reader took 1.2 GB for 8 MB of tags and walked up to
    the root for every paragraph, quadratic in the nesting): only the stack of open elements and
    a count of each name on it, so a closing tag finds its element in constant time.
    """
    reader = _HtmlReader(budget)
    reader.feed(text)
    reader.close()
    return reader.finish()


class _HtmlReader(HTMLParser):
    def __init__(self, budget: _Budget) -> None:
        super().__init__(convert_charrefs=True)
        self.budget = budget
        self.sections = [Section(())]
        self.headings: list[tuple[int, str]] = []
        self.stack: list[str] = []
        self.open: Counter[str] = Counter()
        self.names: dict[str, str] = {}
        self.hidden = 0  # open hidden elements
        self.blocks = 0  # open block elements
        self.heading: int | None = None  # the level of the open outermost heading
        self.text: list[str] = []  # the open paragraph's or heading's pieces
        self.loose: list[str] | None = []  # all visible text, until a paragraph is found
        self.body_seen = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        tag = self.names.setdefault(tag, tag)  # one string per name, however many elements
        if tag == "body":
            self.body_seen = True
            if self.open["head"]:  # a head left open ends where the body starts
                self._pop_to("head")
            if self.loose is not None:
                self.loose.clear()  # the body's text only, as a reader of the page sees it
        self.stack.append(tag)
        self.open[tag] += 1
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCKS:
            if self.blocks == 0 and self.heading is None:
                self.text = []
            self.blocks += 1
        elif tag in _HEADINGS and self.blocks == 0 and self.heading is None:
            self.heading = int(tag[1])
            self.text = []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass  # <x/>: opens nothing, holds no text

    def handle_endtag(self, tag: str) -> None:
        if self.open[tag]:
            self._pop_to(tag)

    def handle_data(self, data: str) -> None:
        if self.hidden:
            return
        if self.blocks or self.heading is not None:
            self.text.append(data)
        if self.loose is not None:
            self.loose.append(data)

    def _pop_to(self, tag: str) -> None:
        """Close every element down to the innermost open ``tag`` (which must be open)."""
        while True:
            name = self.stack.pop()
            self.open[name] -= 1
            self._closed(name)
            if name == tag:
                return

    def _closed(self, name: str) -> None:
        if name in _HIDDEN:
            self.hidden -= 1
        elif name in _BLOCKS:
            self.blocks -= 1
            if self.blocks == 0 and self.heading is None:
                self._paragraph()
        elif name in _HEADINGS and self.heading == int(name[1]) and not self.open[name]:
            # the outermost heading closed: a new section under it
            level = self.heading
            self.headings = [(lv, t) for lv, t in self.headings if lv < level]
            self.headings.append((level, clean(" ".join(self.text))))
            self.sections.append(Section(bounded_path(t for _, t in self.headings)))
            self.heading, self.text = None, []

    def _paragraph(self) -> None:
        paragraphs = list(self.budget.take([" ".join(self.text)]))
        self.text = []
        if paragraphs:
            self.sections[-1].paragraphs.extend(paragraphs)
            self.loose = None  # block markup with text: loose text is not read

    def finish(self) -> list[Section]:
        while self.stack:  # elements never closed end with the document
            self._pop_to(self.stack[-1])
        if self.loose is None:
            return self.sections
        return [Section((), list(self.budget.take(_paragraphs("\n".join(self.loose)))))]


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
        texts: dict[tuple[object, object], str] = {}
        for number, page in enumerate(reader.pages, start=1):
            # pages that draw the same content with the same resources have the same text:
            # parsed once (2,000 pages sharing one stream were parsed 2,000 times)
            drawn = (
                _identity(dict.get(page, "/Contents")),
                _identity(dict.get(page, "/Resources")),
            )
            if drawn not in texts:
                texts[drawn] = page.extract_text() or ""
            paragraphs = budget.take(_paragraphs(texts[drawn]))
            sections.append(Section((f"Page {number}",), list(paragraphs)))
        return sections
    except (ExtractionError, MemoryError):
        raise  # a memory limit is the sandbox's to report
    except FileNotDecryptedError as error:
        raise ExtractionError("the PDF is encrypted") from error
    except PyPdfError as error:
        raise ExtractionError(f"the PDF cannot be read: {type(error).__name__}: {error}") from error
    except Exception as error:  # a corrupt file breaks pypdf in ways it does not wrap
        raise ExtractionError(f"the PDF cannot be read: {type(error).__name__}: {error}") from error


def _identity(value: object) -> object:
    """What a page's ``/Contents`` or ``/Resources`` is, for telling two pages draw the same: an
    indirect object by its number, a small direct one by its value, anything else by itself."""
    from pypdf.generic import ArrayObject, IndirectObject

    if isinstance(value, IndirectObject):
        return ("ref", value.idnum, value.generation)
    if isinstance(value, ArrayObject) and len(value) <= 64:
        return tuple(_identity(item) for item in value)
    text = repr(value)
    return ("value", text) if len(text) <= 2_000 else ("object", id(value))
