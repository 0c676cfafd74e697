"""Retrieval quality on documentation nobody here wrote, against exact vector search.

    python -m bench.quality                  # both sets: the baseline and the search as shipped
    python -m bench.quality --tune           # also the grid of constants, on the tuning set only
    python -m bench.quality --backends torch,openvino   # also each encoder against torch fp32
    python -m bench.quality --smoke          # every step on a few questions of each part

The sets (``bench/corpora.py``): ``tuning`` (the Debian, fetchmail and git FAQs among git's
manual pages) and ``held-out`` (the Python FAQs among the rest of the Python documentation).
Every passage is its own document; a question is answered by one document. Printed per set,
R@1, R@10 and MRR@10 by document of:

* ``exact cosine, whole documents``: the baseline. Each document's text embedded whole (the
  model truncates it at its 256-piece window), the question's nearest documents, exactly;
* ``contextcore``: the documents ingested as the service does (the production chunker and
  encoder, one source per document, in PostgreSQL) and searched by ``search()``, the knowledge
  source's own call: ``limit`` 10 documents, the shipped ``SearchTuning``;
* ``contextcore, vector only`` (no full-text side) and ``contextcore, 10 chunks`` (``results:
  chunks``, the documents of the ten best chunks), to show what each part brings;
* how many questions each of the search and the baseline finds in its top 10 that the other
  misses, with the sign test's two-sided p.

``--tune`` prints the grid (lexical weight, later-chunk penalty, candidates) on the tuning set
and the held-out figures of the tuning set's best: the held-out set is never used to choose.
Vectors are cached under ``~/.cache/contextcore-bench`` by model, backend and text.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import pickle
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import cast

import asyncpg
import numpy as np

from bench.corpora import CACHE, Corpus, Part, held_out, tuning
from contextcore.knowledge.adapters import indexes, store
from contextcore.knowledge.adapters.encoder import (
    DEFAULT_MODEL,
    Backend,
    SentenceTransformerEncoder,
)
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.search import SearchTuning, search
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.chunk import ChunkSettings, WordPieceTokenizer, chunk
from contextcore.knowledge.encoding import Encoder
from contextcore.storage.pool import create_pool
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase

WINDOW = ChunkSettings(max_tokens=256, overlap=32)
TOP = 10


# ------------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Scores:
    r1: float
    r10: float
    mrr10: float
    found: tuple[bool, ...]
    """Per question: is its answer in the top 10."""

    def __str__(self) -> str:
        return f"R@1 {self.r1:.3f}  R@10 {self.r10:.3f}  MRR@10 {self.mrr10:.3f}"


def score(ranked: Sequence[Sequence[str]], gold: Sequence[str]) -> Scores:
    """``ranked[i]``: the document ids of question i's results, best first (repeats allowed:
    the first occurrence counts)."""
    r1 = mrr = 0.0
    found = []
    for results, answer in zip(ranked, gold, strict=True):
        top = list(dict.fromkeys(results))[:TOP]
        found.append(answer in top)
        if answer in top:
            rank = top.index(answer) + 1
            r1 += rank == 1
            mrr += 1 / rank
    n = len(gold)
    return Scores(r1 / n, sum(found) / n, mrr / n, tuple(found))


def sign_test(ours: Scores, theirs: Scores) -> str:
    """Questions only one of two rankings finds, and the two-sided sign test's p."""
    wins = sum(a and not b for a, b in zip(ours.found, theirs.found, strict=True))
    losses = sum(b and not a for a, b in zip(ours.found, theirs.found, strict=True))
    n, k = wins + losses, min(wins, losses)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return f"finds {wins} the baseline misses, misses {losses} it finds (sign test p = {p:.3f})"


# ------------------------------------------------------------------------------- vectors


class CachedEncoder:
    """An encoder whose vectors are kept on disk by text (the bench encodes ~20,000 texts)."""

    def __init__(self, encoder: SentenceTransformerEncoder) -> None:
        self.encoder = encoder
        self.model = encoder.model
        self.dimensions = encoder.dimensions
        self.path = CACHE / f"vectors-{hashlib.sha256(self._key().encode()).hexdigest()[:16]}.pkl"
        self.vectors: dict[str, list[float]] = (
            pickle.loads(self.path.read_bytes()) if self.path.exists() else {}
        )
        self.seconds = 0.0
        self.encoded = 0

    def _key(self) -> str:
        return f"{self.encoder.model}|{self.encoder.backend}"

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        missing = list(
            dict.fromkeys(t for t, k in zip(texts, keys, strict=True) if k not in self.vectors)
        )
        if missing:
            started = time.perf_counter()
            for key, vector in zip(
                [hashlib.sha256(t.encode()).hexdigest() for t in missing],
                self.encoder.encode(missing),
                strict=True,
            ):
                self.vectors[key] = list(vector)
            self.seconds += time.perf_counter() - started
            self.encoded += len(missing)
        return [self.vectors[k] for k in keys]

    def save(self) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(pickle.dumps(self.vectors))


def baseline(parts: Sequence[Part], encoder: Encoder) -> Scores:
    """Exact cosine over whole documents (truncated by the model at its window), each part's
    questions among that part's documents."""
    ranked: list[list[str]] = []
    for part in parts:
        documents = np.asarray(encoder.encode([d.text for d in part.documents]), dtype=np.float32)
        queries = np.asarray(encoder.encode([q.text for q in part.questions]), dtype=np.float32)
        order = np.argsort(-(queries @ documents.T), axis=1)[:, :TOP]
        ids = [d.id for d in part.documents]
        ranked += [[ids[i] for i in row] for row in order]
    return score(ranked, [q.answer for part in parts for q in part.questions])


# ----------------------------------------------------------------------------- in PostgreSQL


async def ingest(
    admin: asyncpg.Connection,
    organization: uuid.UUID,
    part: Part,
    encoder: Encoder,
    tokenizer: WordPieceTokenizer,
) -> dict[uuid.UUID, str]:
    """One ready source per document, its chunks as the embedding group stores them: the
    production chunker, the text embedded. Returns source id -> document id."""
    sources = {uuid.uuid4(): document for document in part.documents}
    rows = [
        (source, c)
        for source, document in sources.items()
        for c in chunk(document.title, list(document.sections), tokenizer, WINDOW)
    ]
    vectors = encoder.encode([c.text for _, c in rows])
    chunk_counts: dict[uuid.UUID, int] = {}
    for source, _ in rows:
        chunk_counts[source] = chunk_counts.get(source, 0) + 1
    await admin.executemany(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, upload_key) VALUES ($1, $2, 'inline', $3, $4, 'text/plain', 'ready', 'bench')",
        [(s, organization, d.title, f"bench://{d.id}") for s, d in sources.items()],
    )
    await admin.executemany(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status) VALUES ($1, $2, $3, 1, $4, $4, 'ready')",
        [(organization, s, encoder.model, n) for s, n in chunk_counts.items()],
    )
    await admin.executemany(
        "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model, generation,"
        " ordinal, section, text, tokens, embedding) VALUES ($1, $2, $3, 1, $4, $5, $6, $7,"
        " $8::vector)",
        [
            (
                organization,
                source,
                encoder.model,
                c.ordinal,
                c.section,
                c.text,
                c.tokens,
                store.vector_text(vector),
            )
            for (source, c), vector in zip(rows, vectors, strict=True)
        ],
    )
    await admin.execute("ANALYZE knowledge_chunks")
    return {s: d.id for s, d in sources.items()}


@dataclass(frozen=True)
class Loaded:
    """One part in PostgreSQL: its organization, and which document each source is."""

    part: Part
    organization: uuid.UUID
    documents: dict[uuid.UUID, str]


async def searched(
    db: TenantDatabase,
    loaded: Sequence[Loaded],
    encoder: Encoder,
    tuning: SearchTuning,
    *,
    per_document: int | None = 1,
) -> tuple[Scores, float]:
    """``search()`` for every question in its part's organization, limit 10; the scores and
    the mean milliseconds of a search (the query's encode included)."""

    async def encoders(model: str) -> Encoder:
        return encoder

    vectors = QueryVectors(encoders, max_entries=0)  # every encode timed, none cached
    ranked = []
    started = time.perf_counter()
    for one in loaded:
        for question in one.part.questions:
            hits = await search(
                db,
                one.organization,
                vectors,
                question.text,
                include_platform=False,
                include_organization=True,
                limit=TOP,
                per_document=per_document,
                tuning=tuning,
            )
            ranked.append([one.documents[h.source_id] for h in hits])
    gold = [q.answer for one in loaded for q in one.part.questions]
    elapsed = (time.perf_counter() - started) / len(gold) * 1000
    return score(ranked, gold), elapsed


WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)
PENALTIES = (0.0, 0.05, 0.1, 0.2)
CANDIDATES = (40,)


async def tune(db: TenantDatabase, loaded: dict[str, list[Loaded]], encoder: Encoder) -> None:
    """The grid on the tuning set; the best by R@10 + MRR@10 there, tried on the held-out."""
    results = []
    for weight, penalty, candidates in product(WEIGHTS, PENALTIES, CANDIDATES):
        tried = replace(
            SearchTuning(),
            lexical_weight=weight,
            later_chunk_penalty=penalty,
            candidates=candidates,
        )
        scores, _ = await searched(db, loaded["tuning"], encoder, tried)
        results.append((scores.r10 + scores.mrr10, tried, scores))
        print(f"  w={weight:<5g} penalty={penalty:<5g} candidates={candidates:<4} {scores}")
    _, best, best_scores = max(results, key=lambda r: r[0])
    held, _ = await searched(db, loaded["held-out"], encoder, best)
    print(f"  best on tuning: {best}\n    tuning   {best_scores}\n    held-out {held}")


def backends(corpus: Corpus, names: list[str], settings: KnowledgeSettings) -> None:
    """Each backend against torch fp32 on one set's chunks: speed, cosine, R@10."""
    tokenizer = WordPieceTokenizer(settings.path())
    texts = [
        c.text
        for d in corpus.documents
        for c in chunk(d.title, list(d.sections), tokenizer, WINDOW)
    ]
    reference: np.ndarray | None = None
    reference_rate = 0.0
    for name in names:
        if name not in ("torch", "onnx", "openvino"):
            raise SystemExit(f"unknown backend {name!r}")
        encoder = SentenceTransformerEncoder(
            DEFAULT_MODEL, settings.path(), backend=cast(Backend, name), cache_dir=CACHE / "models"
        )
        started = time.perf_counter()
        vectors = np.asarray(encoder.encode(texts), dtype=np.float32)
        rate = len(texts) / (time.perf_counter() - started)
        if reference is None:
            reference, reference_rate = vectors, rate
        cosine = (vectors * reference).sum(axis=1)
        print(
            f"  {name:9} {encoder.backend:9} {rate:6.1f} chunks/s"
            f" ({rate / reference_rate:.2f}x the first)  cosine to the first: min"
            f" {cosine.min():.5f} mean {cosine.mean():.5f}  {baseline(corpus.parts, encoder)}"
        )


def smaller(corpus: Corpus, questions: int, documents: int) -> Corpus:
    """``corpus`` with each part's first ``questions`` questions, their answers, and other
    documents up to ``documents`` in all: a smoke run's (its figures mean little)."""
    parts = []
    for part in corpus.parts:
        asked = part.questions[:questions]
        answers = {q.answer for q in asked}
        kept = [d for d in part.documents if d.id in answers]
        kept += [d for d in part.documents if d.id not in answers][: max(documents - len(kept), 0)]
        parts.append(Part(part.name, tuple(kept), asked))
    return Corpus(corpus.name, tuple(parts))


SMOKE_QUESTIONS, SMOKE_DOCUMENTS = 5, 40
"""``--smoke``: each part's questions and documents (tests/integration/test_bench_smoke.py)."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__)
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--backends", default="", help="e.g. torch,openvino (off by default)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"each part's first {SMOKE_QUESTIONS} questions among {SMOKE_DOCUMENTS} documents "
        "(the held-out set's of a few pages): every step in seconds; the figures mean little",
    )
    args = parser.parse_args()
    from bench.seeded import database_name, drop, prepare

    if args.smoke:
        found = (tuning(), held_out(pages=2))
        corpora = {c.name: smaller(c, SMOKE_QUESTIONS, SMOKE_DOCUMENTS) for c in found}
    else:
        corpora = {c.name: c for c in (tuning(), held_out())}
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    flags = cpu_flags()
    print(f"CPU flags: {flags or 'none of avx512_bf16, amx_bf16, amx_int8, amx_tile'}")
    for corpus in corpora.values():
        print(
            f"{corpus.name}: {len(corpus.documents)} documents, {len(corpus.questions)} questions"
        )
    encoder = CachedEncoder(
        SentenceTransformerEncoder(
            DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
        )
    )
    tokenizer = WordPieceTokenizer(settings.path())
    name = database_name("bench_quality", args.smoke)
    seeded = await prepare(name, 0)
    try:
        admin = await asyncpg.connect(seeded.admin_url)
        owner = await asyncpg.connect(seeded.owner_url)
        loaded: dict[str, list[Loaded]] = {}
        try:
            for corpus in corpora.values():
                loaded[corpus.name] = []
                for part in corpus.parts:  # one product, one tenant
                    organization = uuid.uuid4()
                    await admin.execute(
                        "INSERT INTO organizations (id, name) VALUES ($1, $2)",
                        organization,
                        part.name,
                    )
                    documents = await ingest(admin, organization, part, encoder, tokenizer)
                    loaded[corpus.name].append(Loaded(part, organization, documents))
                    # as in production: a tenant past the threshold has its own HNSW index
                    if len(part.documents) >= indexes.MIN_CHUNKS:
                        await owner.execute(
                            indexes.create_sql(organization, encoder.model, encoder.dimensions)
                        )
        finally:
            await admin.close()
            await owner.close()
        encoder.save()
        pool = await create_pool(seeded.url, max_size=2, session_role=SERVICE_ROLE)
        db = TenantDatabase(pool)
        try:
            for c, corpus in corpora.items():
                base = baseline(corpus.parts, encoder)
                ours, ms = await searched(db, loaded[c], encoder, SearchTuning())
                vector, _ = await searched(
                    db, loaded[c], encoder, replace(SearchTuning(), lexical_weight=0.0)
                )
                chunks, _ = await searched(
                    db, loaded[c], encoder, SearchTuning(), per_document=None
                )
                print(f"\n{c}")
                print(f"  exact cosine, whole documents   {base}")
                print(f"  contextcore                     {ours}   ({ms:.1f} ms a search)")
                print(f"    vector only                   {vector}")
                print(f"    10 chunks, their documents    {chunks}")
                print(
                    f"  against the baseline: R@10 {100 * (ours.r10 - base.r10):+.1f} points,"
                    f" MRR@10 {100 * (ours.mrr10 - base.mrr10):+.1f}; {sign_test(ours, base)}"
                )
                if len(corpus.parts) > 1:
                    for one in loaded[c]:
                        part_ours, _ = await searched(db, [one], encoder, SearchTuning())
                        print(
                            f"    {one.part.name:10} {len(one.part.questions):4} questions"
                            f" {len(one.part.documents):5} documents: baseline"
                            f" {baseline([one.part], encoder)}; contextcore {part_ours}"
                        )
            encoder.save()
            if args.tune:
                print("\ngrid on the tuning set (R@1 R@10 MRR@10)")
                await tune(db, loaded, encoder)
        finally:
            await pool.close()
    finally:
        await drop(seeded.stack, name)
    if args.backends:
        print("\nbackends on the held-out set's chunks, against the first named")
        backends(corpora["held-out"], args.backends.split(","), settings)


def cpu_flags() -> str:
    """The CPU features encoder speed depends on (docs/knowledge.md)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            line = next(line for line in cpuinfo if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
    return " ".join(f for f in wanted if f in line.split())


if __name__ == "__main__":
    asyncio.run(main())
