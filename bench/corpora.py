"""The quality sets: real documentation with real questions, each passage its own document.

Two sets, from different projects, so a constant chosen on one is tried on the other. Each part
of a set is one product's documentation, searched as one tenant's knowledge: its FAQ's answers
among the sections of the same product's manuals, which share their words (a help centre is one
product's, and a word like the product's name finds nothing in it).

* ``tuning``: three parts. The Debian FAQ (``debian-faq``) among the Debian Reference
  (``debian-reference-en``); the fetchmail FAQ among fetchmail's other pages (``fetchmail``);
  gitfaq among git's manual pages (``git-doc``). ``bench.quality --tune`` chooses the search's
  constants on this set only.
* ``held-out``: one part, the Python FAQs (``python3.11-doc``) among the rest of the Python
  documentation (tutorial, library, reference, how-tos). Never tuned on.

A question is a FAQ heading; its answer (the paragraphs under it, without the heading, or
retrieval would only match a heading against itself) is one document, titled by its FAQ and with
the FAQ's chapter as its heading. A distractor is a section of a manual page, titled by its
page, with its heading; a long section is cut at paragraphs into passages of at most
``PASSAGE_CHARS``. Every document is one source, as an uploaded passage would be. Packages come
from Debian with ``apt-get download`` into ``~/.cache/contextcore-bench`` (once).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextcore.knowledge.extract import Section, clean

CACHE = Path.home() / ".cache" / "contextcore-bench"
PACKAGES = (
    "debian-faq",
    "debian-reference-en",
    "debian-reference-common",
    "fetchmail",
    "git-doc",
    "python3.11-doc",
)
NUMBERING = re.compile(r"^\s*(?:[A-Z]{0,2}\d+(?:\.\d+)*\.?|Q\d*[:.])\s*")
HEADINGS = ("h1", "h2", "h3", "h4", "dt")
SECTION_HEADINGS = ("h1", "h2", "h3", "h4")
BLOCKS = ("p", "li", "pre", "dd", "td", "blockquote")
PASSAGE_CHARS = 1_500
DOCUMENTS = 4_500
"""Documents per part at most, answers and distractors together (a real product's help)."""


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    sections: tuple[Section, ...]

    @property
    def text(self) -> str:
        return "\n\n".join(p for s in self.sections for p in s.paragraphs)


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    """The id of the document that answers it."""
    faq: str


@dataclass(frozen=True)
class Part:
    """One product's documentation: one tenant's knowledge, and the questions asked of it."""

    name: str
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Corpus:
    name: str
    parts: tuple[Part, ...]

    @property
    def questions(self) -> tuple[Question, ...]:
        return tuple(q for part in self.parts for q in part.questions)

    @property
    def documents(self) -> tuple[Document, ...]:
        return tuple(d for part in self.parts for d in part.documents)


def fetch() -> Path:
    """The packages' files, unpacked under the cache (downloaded once)."""
    root = CACHE / "debs"
    unpacked = root / "x"
    if not (unpacked / "usr/share/debian-reference/ch01.en.html").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=root, check=True)
        for deb in root.glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return unpacked / "usr/share/doc"


def _soup(path: Path) -> Any:
    from bs4 import BeautifulSoup

    html = path.read_text(errors="replace").replace("\N{PILCROW SIGN}", "")
    soup = BeautifulSoup(html, "html.parser")
    for navigation in soup.select("div.sphinxsidebar, div.related, div.footer, nav, script"):
        navigation.decompose()
    return soup


def _title(soup: Any, fallback: str) -> str:
    title = soup.find("title")
    text = clean(title.get_text(" ")) if title else ""
    return (text.split(" \N{EM DASH} ")[0] or fallback)[:200]


def faq_answers(path: Path, name: str, title: str | None = None) -> list[tuple[Question, Document]]:
    """Questions (a heading or term ending in '?') and the answer under each, as documents."""
    soup = _soup(path)
    title = title or _title(soup, name)
    found: list[tuple[str, str, list[str]]] = []
    chapter = ""
    current: list[str] | None = None
    for element in soup.find_all([*HEADINGS, *BLOCKS]):
        if element.find_parent(BLOCKS) is not None:
            continue
        text = clean(element.get_text(" "))
        if element.name in HEADINGS:
            if text.endswith("?"):
                current = []
                found.append((NUMBERING.sub("", text), chapter, current))
            else:
                chapter, current = NUMBERING.sub("", text).removeprefix("Chapter "), None
        elif current is not None and text:
            current.append(text)
    pairs = []
    for i, (question, chapter, paragraphs) in enumerate(found):
        if sum(len(p) for p in paragraphs) < 40:
            continue
        document = Document(
            f"{name}#{i}", title, (Section((chapter,) if chapter else (), paragraphs),)
        )
        pairs.append((Question(question, document.id, name), document))
    return pairs


def manual_sections(path: Path, name: str) -> list[Document]:
    """A manual page's sections as passages: its heading, at most ``PASSAGE_CHARS`` each."""
    soup = _soup(path)
    title = _title(soup, name)
    sections: list[tuple[str, list[str]]] = []
    heading = ""
    for element in soup.find_all([*SECTION_HEADINGS, *BLOCKS]):
        if element.find_parent(BLOCKS) is not None:
            continue
        text = clean(element.get_text(" "))
        if element.name in SECTION_HEADINGS:
            heading = text
            sections.append((heading, []))
        elif text and sections:
            sections[-1][1].append(text[:PASSAGE_CHARS])
    documents: list[Document] = []
    for heading, paragraphs in sections:
        passage: list[str] = []
        for paragraph in [*paragraphs, ""]:
            if paragraph and sum(len(p) for p in passage) + len(paragraph) <= PASSAGE_CHARS:
                passage.append(paragraph)
                continue
            if sum(len(p) for p in passage) >= 80:
                documents.append(
                    Document(
                        f"{name}@{len(documents)}",
                        title,
                        (Section((heading,) if heading != title else (), list(passage)),),
                    )
                )
            passage = [paragraph] if paragraph else []
    return documents


def _part(name: str, pairs: list[tuple[Question, Document]], distractors: list[Document]) -> Part:
    room = max(DOCUMENTS - len(pairs), 0)
    step = max(len(distractors) / room, 1.0) if room else float("inf")
    chosen = [distractors[int(i * step)] for i in range(min(room, len(distractors)))]
    return Part(name, tuple(d for _, d in pairs) + tuple(chosen), tuple(q for q, _ in pairs))


def _manuals(pages: list[Path], prefix: str) -> list[Document]:
    return [d for page in pages for d in manual_sections(page, f"{prefix}{page.stem}")]


def tuning() -> Corpus:
    docs = fetch()
    debian: list[tuple[Question, Document]] = []
    for page in sorted((docs / "debian/FAQ").glob("*.en.html")):
        if page.name not in {"index.en.html", "faqinfo.en.html"}:
            debian += faq_answers(page, f"debian-{page.stem}", "The Debian GNU/Linux FAQ")
    reference = sorted((docs.parent / "debian-reference").glob("*.en.html"))
    fetchmail = docs / "fetchmail"
    git = [p for p in sorted((docs / "git-doc").glob("git*.html")) if p.name != "gitfaq.html"]
    return Corpus(
        "tuning",
        (
            _part("debian", debian, _manuals(reference, "debian-reference-")),
            _part(
                "fetchmail",
                faq_answers(fetchmail / "fetchmail-FAQ.html", "fetchmail", "Fetchmail FAQ"),
                _manuals(
                    [fetchmail / n for n in ("fetchmail-features.html", "design-notes.html")],
                    "fetchmail-",
                ),
            ),
            _part(
                "git",
                faq_answers(docs / "git-doc/gitfaq.html", "gitfaq", "gitfaq"),
                _manuals(git, "git-"),
            ),
        ),
    )


def held_out(pages: int | None = None) -> Corpus:
    """The held-out set; with ``pages``, only the first that many pages of each folder (a smoke
    run's: reading the whole documentation takes most of a minute)."""
    html = fetch() / "python3.11/html"
    pairs: list[tuple[Question, Document]] = []
    faqs = [page for page in sorted((html / "faq").glob("*.html")) if page.name != "index.html"]
    for page in faqs[:pages]:
        pairs += faq_answers(page, f"python-faq-{page.stem}")
    distractors: list[Document] = []
    for part in ("tutorial", "howto", "library", "reference", "using", "extending"):
        distractors += _manuals(sorted((html / part).glob("*.html"))[:pages], f"python-{part}-")
    return Corpus("held-out", (_part("python", pairs, distractors),))
