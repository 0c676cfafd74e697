"""Retrieval quality on documentation nobody here wrote: FAQs shipped in Debian packages.

    python -m bench.quality [--backends torch,openvino] [--weights 0,0.05,0.1,0.2,0.4]

The sets: the Debian FAQ (package ``debian-faq``), the fetchmail FAQ (``fetchmail``) and
gitfaq (``git-doc``), fetched with ``apt-get download`` into ``~/.cache/contextcore-bench``.
Each question heading is a query; its answer is the passage to find. The corpus is the answers
under their chapter headings, *without* the question headings (or retrieval would only match a
heading against itself). A query scores by the best-ranked chunk of its answer (a long answer
becomes several chunks).

Printed, per set and in all: R@1, R@10 and MRR@10 of

* chunking strategies, vector only: ``structure`` (the production chunker: whole paragraphs in
  the model's 256-piece window, the heading path embedded with the text), ``structure-bare``
  (the same chunks without the heading), ``structure-128`` (a 128-piece window), ``window-128``
  and ``window-200`` (blind windows of the answer text, 32 pieces of overlap, no heading);
* the lexical signal's variants as a re-ranker of the vector candidates;
* ``knowledge_search`` itself, in PostgreSQL, vector only and hybrid at each lexical weight;
* each encoder backend against torch fp32 (cosine of the vectors, R@10, passages/s).

Constants are chosen on all three sets at once and the per-set figures printed beside the
total: a constant that helps one set and hurts another is not kept.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import numpy as np

from contextcore.knowledge import store
from contextcore.knowledge.chunk import Chunk, ChunkSettings, WordPieceTokenizer, chunk
from contextcore.knowledge.encoder import DEFAULT_MODEL, SentenceTransformerEncoder
from contextcore.knowledge.extract import Section, clean
from contextcore.knowledge.search import SEARCH
from contextcore.knowledge.settings import KnowledgeSettings
from contextcore.storage.tenancy import TenantDatabase

CACHE = Path.home() / ".cache" / "contextcore-bench"
PACKAGES = ("debian-faq", "fetchmail", "git-doc")
NUMBERING = re.compile(r"^\s*(?:[A-Z]{0,2}\d+(?:\.\d+)*\.?|Q\d*[:.])\s*")
HEADINGS = ("h1", "h2", "h3", "h4", "dt")
BLOCKS = ("p", "li", "pre", "dd", "td", "blockquote")


@dataclass
class QA:
    id: str
    question: str
    chapter: str
    paragraphs: list[str] = field(default_factory=list)


@dataclass
class FaqSet:
    name: str
    title: str
    qas: list[QA]


def fetch() -> Path:
    """The packages' files, unpacked under the cache (downloaded once)."""
    root = CACHE / "debs"
    unpacked = root / "x"
    if not (unpacked / "usr/share/doc/git-doc/gitfaq.html").exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=root, check=True)
        for deb in root.glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return unpacked / "usr/share/doc"


def parse(html: str, name: str, chapter: str = "") -> list[QA]:
    """Questions (a heading or term ending in '?') and the blocks under each."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    qas: list[QA] = []
    current: QA | None = None
    for element in soup.find_all([*HEADINGS, *BLOCKS]):
        if element.find_parent(BLOCKS) is not None:
            continue
        text = clean(element.get_text(" "))
        if element.name in HEADINGS:
            if text.endswith("?"):
                current = QA(f"{name}#{len(qas)}", NUMBERING.sub("", text), chapter)
                qas.append(current)
            else:
                chapter, current = NUMBERING.sub("", text).removeprefix("Chapter "), None
        elif current is not None and text:
            current.paragraphs.append(text)
    return [qa for qa in qas if sum(len(p) for p in qa.paragraphs) >= 40]


def sets() -> list[FaqSet]:
    docs = fetch()
    debian = []
    for page in sorted((docs / "debian/FAQ").glob("*.en.html")):
        if page.name not in {"index.en.html", "faqinfo.en.html"}:
            debian += parse(page.read_text(), f"debian-{page.stem}")
    return [
        FaqSet("debian-faq", "The Debian GNU/Linux FAQ", debian),
        FaqSet(
            "fetchmail",
            "Fetchmail FAQ",
            parse((docs / "fetchmail/fetchmail-FAQ.html").read_text(), "fetchmail"),
        ),
        FaqSet("gitfaq", "gitfaq", parse((docs / "git-doc/gitfaq.html").read_text(), "gitfaq")),
    ]


# ------------------------------------------------------------------------ chunking strategies


@dataclass
class Passage:
    qa: str
    text: str
    """What the model embeds."""
    chunk: Chunk


Strategy = Callable[[FaqSet, WordPieceTokenizer], list[Passage]]


def structure(bare: bool = False, window: ChunkSettings | None = None) -> Strategy:
    settings = window or WINDOW

    def cut(faq: FaqSet, tokenizer: WordPieceTokenizer) -> list[Passage]:
        passages = []
        for qa in faq.qas:
            section = [Section((qa.chapter,), qa.paragraphs)]
            chunks = chunk(faq.title, section, tokenizer, settings)
            for c in chunks:
                passages.append(Passage(qa.id, c.text if bare else c.embedded, c))
        return passages

    return cut


def windows(size: int) -> Strategy:
    def cut(faq: FaqSet, tokenizer: WordPieceTokenizer) -> list[Passage]:
        passages = []
        for qa in faq.qas:
            for text in tokenizer.windows(" ".join(qa.paragraphs), size, 32):
                passages.append(Passage(qa.id, text, Chunk(0, "", text, size)))
        return passages

    return cut


WINDOW = ChunkSettings(max_tokens=256, overlap=32)
STRATEGIES: dict[str, Strategy] = {
    "structure": structure(),
    "structure-bare": structure(bare=True),
    "structure-128": structure(window=ChunkSettings(max_tokens=128, overlap=16)),
    "window-128": windows(126),
    "window-200": windows(198),
}


# ------------------------------------------------------------------------------- scoring


@dataclass
class Scores:
    r1: float
    r10: float
    mrr10: float

    def __str__(self) -> str:
        return f"R@1 {self.r1:.3f}  R@10 {self.r10:.3f}  MRR@10 {self.mrr10:.3f}"


def score(ranked: Sequence[Sequence[str]], gold: Sequence[str]) -> Scores:
    """``ranked[i]``: the qa ids of query i's results, best first (repeats allowed)."""
    r1 = r10 = mrr = 0.0
    for results, answer in zip(ranked, gold, strict=True):
        top = list(dict.fromkeys(results))[:10]
        if answer in top:
            rank = top.index(answer) + 1
            r10 += 1
            r1 += rank == 1
            mrr += 1 / rank
    n = len(gold)
    return Scores(r1 / n, r10 / n, mrr / n)


def report(ranked: list[list[str]], faqs: list[FaqSet], gold: dict[str, list[str]]) -> str:
    """All queries (every set's, over one corpus of every set), then each set's."""
    lines = [str(score(ranked, [g for f in faqs for g in gold[f.name]]))]
    offset = 0
    for f in faqs:
        n = len(gold[f.name])
        lines.append(f"      {f.name:12} {score(ranked[offset : offset + n], gold[f.name])}")
        offset += n
    return "\n".join(lines)


def exact_ranking(queries: np.ndarray, passages: np.ndarray, labels: list[str]) -> list[list[str]]:
    order = np.argsort(-(queries @ passages.T), axis=1)[:, :30]
    return [[labels[i] for i in row] for row in order]


def encode(encoder: SentenceTransformerEncoder, texts: list[str]) -> tuple[np.ndarray, float]:
    started = time.perf_counter()
    vectors = np.asarray(encoder.encode(texts), dtype=np.float32)
    return vectors, len(texts) / (time.perf_counter() - started)


# ----------------------------------------------------------------------------- in PostgreSQL


async def load(
    admin: asyncpg.Connection,
    organization: uuid.UUID,
    faq: FaqSet,
    passages: list[Passage],
    vectors: np.ndarray,
) -> dict[int, str]:
    """One ready source per set, its chunks as the embedding group stores them; chunk id -> qa."""
    source = uuid.uuid4()
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/html', 'ready', 'bench')",
        source,
        organization,
        faq.title,
        f"bench://{faq.name}",
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status) VALUES ($1, $2, $3, 1, $4, $4, 'ready')",
        organization,
        source,
        DEFAULT_MODEL,
        len(passages),
    )
    await admin.executemany(
        "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation,"
        " ordinal, section, text, tokens, embedding) VALUES ($1, $2, $3, 1, $4, $5, $6, $7,"
        " $8::vector)",
        [
            (
                organization,
                source,
                DEFAULT_MODEL,
                i,
                p.chunk.section,
                p.chunk.text,
                max(p.chunk.tokens, 1),
                store.vector_text(v.tolist()),
            )
            for i, (p, v) in enumerate(zip(passages, vectors, strict=True))
        ],
    )
    rows = await admin.fetch(
        "SELECT id, ordinal FROM knowledge_chunks WHERE source_id = $1", source
    )
    return {r["id"]: passages[r["ordinal"]].qa for r in rows}


async def search_all(
    db: TenantDatabase,
    organization: uuid.UUID,
    questions: list[str],
    queries: np.ndarray,
    labels: dict[int, str],
    weight: float | None,
) -> list[list[str]]:
    ranked = []
    async with db.scoped(organization) as tenant:
        for question, query in zip(questions, queries, strict=True):
            rows = await tenant.fetch(
                SEARCH,
                store.vector_text(query.tolist()),
                "" if weight is None else question,
                False,
                True,
                30,
                40,
                weight or 0.0,
                200,
            )
            ranked.append([labels[r["chunk_id"]] for r in rows])
    return ranked


LEXICAL = """
-- the candidates' lexical scores under each variant: dictionary, AND or OR of the query's
-- lexemes, ts_rank or ts_rank_cd, section-heavy or even weights
WITH q AS (
    SELECT websearch_to_tsquery('english', $2) AS en_and,
           replace(plainto_tsquery('english', $2)::text, '&', '|')::tsquery AS en_or,
           replace(plainto_tsquery('simple', $2)::text, '&', '|')::tsquery AS simple_or,
           websearch_to_tsquery('english', regexp_replace(
               btrim(regexp_replace($2, '["-]+', ' ', 'g')), '\\s+', ' or ', 'g')) AS production
)
SELECT c.id,
       ts_rank_cd(c.lexemes, q.en_and, 32) AS en_and_cd,
       ts_rank_cd(c.lexemes, q.en_or, 32) AS en_or_cd,
       ts_rank(c.lexemes, q.en_or, 32) AS en_or_rank,
       ts_rank('{0.1,0.2,1.0,1.0}', c.lexemes, q.en_or, 32) AS en_or_even,
       ts_rank(setweight(to_tsvector('simple', c.section), 'A')
               || setweight(to_tsvector('simple', c.text), 'B'), q.simple_or, 32) AS simple_or,
       ts_rank('{0.1,0.2,1.0,1.0}', c.lexemes, q.production, 32) AS production
FROM knowledge_chunks c, q
WHERE c.id = ANY($1::bigint[])
"""
VARIANTS = ("en_and_cd", "en_or_cd", "en_or_rank", "en_or_even", "simple_or", "production")


async def lexical_variants(
    pool: asyncpg.Pool,
    organization: uuid.UUID,
    questions: list[str],
    queries: np.ndarray,
    labels: dict[int, str],
    faqs: list[FaqSet],
    gold: dict[str, list[str]],
) -> None:
    db = TenantDatabase(pool)
    candidates = []
    async with db.scoped(organization) as tenant:
        for question, query in zip(questions, queries, strict=True):
            rows = await tenant.fetch(
                SEARCH, store.vector_text(query.tolist()), "", False, True, 40, 40, 0.0, 200
            )
            ids = [r["chunk_id"] for r in rows]
            similarity = {r["chunk_id"]: r["similarity"] for r in rows}
            lexical = {r["id"]: dict(r) for r in await tenant._conn.fetch(LEXICAL, ids, question)}
            candidates.append([(i, similarity[i], lexical[i]) for i in ids])
    for variant in VARIANTS:
        for weight in (0.1, 0.2, 0.4, 0.8, 1.6):
            ranked = [
                [labels[i] for i, _, _ in sorted(c, key=lambda x: -(x[1] + weight * x[2][variant]))]
                for c in candidates
            ]
            summary = report(ranked, faqs, gold).splitlines()[0]
            print(f"  {variant:11} w={weight:<4g} {summary}")


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__)
    parser.add_argument("--backends", default="torch,openvino")
    parser.add_argument("--weights", default="0.1,0.2,0.4")
    args = parser.parse_args()
    from bench.seeded import drop, prepare

    faqs = sets()
    questions = {f.name: [qa.question for qa in f.qas] for f in faqs}
    gold = {f.name: [qa.id for qa in f.qas] for f in faqs}
    print("sets: " + ", ".join(f"{f.name} {len(f.qas)} questions" for f in faqs))
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    tokenizer = WordPieceTokenizer(settings.path())
    encoders = {
        name: SentenceTransformerEncoder(
            DEFAULT_MODEL,
            settings.path(),
            backend=name,
            cache_dir=CACHE / "models",
        )
        for name in args.backends.split(",")
    }
    reference = encoders.get("torch") or next(iter(encoders.values()))
    chosen = encoders.get("openvino") or reference

    print("\nchunking (vector only, exact cosine, the chosen backend)")
    cut = {
        name: {f.name: strategy(f, tokenizer) for f in faqs}
        for name, strategy in STRATEGIES.items()
    }
    query_vectors = {f.name: encode(chosen, questions[f.name])[0] for f in faqs}
    passage_vectors: dict[str, dict[str, np.ndarray]] = {}
    for name in STRATEGIES:
        passages = [p for f in faqs for p in cut[name][f.name]]
        vectors, _ = encode(chosen, [p.text for p in passages])
        passage_vectors[name] = {}
        offset = 0
        for f in faqs:  # kept per set for loading into PostgreSQL below
            passage_vectors[name][f.name] = vectors[offset : offset + len(cut[name][f.name])]
            offset += len(cut[name][f.name])
        queries = np.concatenate([query_vectors[f.name] for f in faqs])
        ranked = exact_ranking(queries, vectors, [p.qa for p in passages])
        print(f"  {name:15} {report(ranked, faqs, gold)}   ({len(passages)} chunks)")

    print("\nbackends (structure chunks, vector only) against torch fp32")
    texts = [p.text for f in faqs for p in cut["structure"][f.name]]
    base, base_rate = encode(reference, texts)
    all_questions = [q for f in faqs for q in questions[f.name]]
    all_gold = [g for f in faqs for g in gold[f.name]]
    labels = [p.qa for f in faqs for p in cut["structure"][f.name]]
    for name, encoder in encoders.items():
        vectors, rate = encode(encoder, texts) if encoder is not reference else (base, base_rate)
        cosine = (vectors * base).sum(axis=1)
        queries = encode(encoder, all_questions)[0]
        s = score(exact_ranking(queries, vectors, labels), all_gold)
        print(
            f"  {name:9} {encoder.backend:9} {rate:6.1f} passages/s ({rate / base_rate:.2f}x torch)"
            f"  cosine to torch min {cosine.min():.5f} mean {cosine.mean():.5f}  {s}"
        )

    print("\nknowledge_search in PostgreSQL (structure chunks)")
    name = "bench_quality"
    seeded = await prepare(name, 0)
    try:
        organization = uuid.uuid4()
        admin = await asyncpg.connect(seeded.admin_url)
        labels_by_set = {}
        try:
            await admin.execute(
                "INSERT INTO organizations (id, name) VALUES ($1, 'q')", organization
            )
            for f in faqs:
                labels_by_set[f.name] = await load(
                    admin,
                    organization,
                    f,
                    cut["structure"][f.name],
                    passage_vectors["structure"][f.name],
                )
        finally:
            await admin.close()
        pool = await asyncpg.create_pool(seeded.url, min_size=1, max_size=2)
        db = TenantDatabase(pool)
        try:
            weights: list[float | None] = [None, *[float(w) for w in args.weights.split(",")]]
            every_label = {k: v for labels in labels_by_set.values() for k, v in labels.items()}
            queries = np.concatenate([query_vectors[f.name] for f in faqs])
            for weight in weights:
                ranked = await search_all(
                    db, organization, all_questions, queries, every_label, weight
                )
                label = "vector only" if weight is None else f"hybrid w={weight:g}"
                print(f"  {label:15} {report(ranked, faqs, gold)}")
            print("\nthe lexical signal, re-ranking the 40 vector candidates (variants)")
            await lexical_variants(
                pool, organization, all_questions, queries, every_label, faqs, gold
            )
        finally:
            await pool.close()
    finally:
        await drop(seeded.stack, name)


if __name__ == "__main__":
    asyncio.run(main())
