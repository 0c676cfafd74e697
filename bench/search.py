"""knowledge_search at scale: p50/p99 and recall@10 for small and large tenants.

    python -m bench.search [--chunks 100000] [--organizations 100] [--queries 200] [--smoke]

Rows: 100,000 chunks (``--chunks 1000000`` for a million) over 100 organizations of Zipf-skewed
sizes (s = 1.1: the largest holds ~19% of the rows, the smallest ~100). Vectors are real
embeddings made dense: 4,000 passages of git's documentation (``git-doc``) are encoded by the
default model once (cached), and each row is one of them plus a little Gaussian noise,
re-normalised, so the rows keep the real embedding space's shape without 100,000 encodes.
Queries are real questions (the tuning set of ``bench.corpora``) embedded by the same model.

The plan is production's: tenants at or above ``--threshold`` chunks (``contextcore knowledge
index``'s default, 2,000) get their partial HNSW index; the rest are searched exactly. Each
query runs as the build consumer's knowledge source runs it: the runtime login enters the
tenant's scope and calls ``knowledge_search`` (no query text: the vector path, which the
lexical re-rank only reorders). Recall@10 is against exact cosine over the tenant's rows.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import asyncpg
import numpy as np

from bench.corpora import CACHE, fetch, tuning
from bench.seeded import database_name, drop, prepare
from contextcore.knowledge.adapters import indexes, store
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, SentenceTransformerEncoder
from contextcore.knowledge.adapters.search import SEARCH
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.extract import extract
from contextcore.storage.tenancy import TenantDatabase


def base_vectors(encoder: SentenceTransformerEncoder, count: int = 4_000) -> np.ndarray:
    cached = CACHE / f"git-doc-passages-{count}.npy"
    if cached.exists():
        loaded: np.ndarray = np.load(cached)
        return loaded
    passages: list[str] = []
    for page in sorted((fetch() / "git-doc").glob("*.html")):
        for section in extract(page.read_bytes(), "text/html"):
            passages += [p for p in section.paragraphs if len(p) > 40]
        if len(passages) >= count:
            break
    vectors = np.asarray(encoder.encode(passages[:count]), dtype=np.float32)
    # written whole, then renamed: benches running at once (the smoke test's) read no half file
    partial = cached.with_suffix(f".{uuid.uuid4().hex[:8]}.partial.npy")
    np.save(partial, vectors)
    partial.rename(cached)
    return vectors


def tenant_vectors(chunks: int, passages: int = 4_000) -> np.ndarray:
    """``chunks`` unit vectors drawn from ``passages`` git-doc passages with a little noise
    (seed 3): one tenant's documents for the knowledge benches, encoded by the light OpenVINO
    encoder."""
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = SentenceTransformerEncoder(
        DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
    )
    base = base_vectors(encoder, passages)
    rng = np.random.default_rng(3)
    rows = base[rng.integers(0, len(base), chunks)]
    rows = rows + rng.normal(0, 0.02, rows.shape).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def sizes(total: int, organizations: int) -> list[int]:
    weights = 1 / np.arange(1, organizations + 1) ** 1.1
    counts = np.maximum((weights / weights.sum() * total).astype(int), 1)
    return [int(c) for c in counts]


async def seed(
    admin: asyncpg.Connection,
    organization: uuid.UUID,
    vectors: np.ndarray,
    *,
    new_organization: bool = True,
) -> None:
    """One ready document of ``len(vectors)`` chunks for ``organization`` (created unless it
    exists: ``new_organization=False``)."""
    source = uuid.uuid4()
    if new_organization:
        await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'b')", organization)
    await admin.execute(
        "INSERT INTO knowledge_sources (id, organization_id, kind, title, uri, media_type,"
        " status, upload_key) VALUES ($1, $2, 'inline', 'docs', 'bench://docs', 'text/html',"
        " 'ready', 'bench')",
        source,
        organization,
    )
    await admin.execute(
        "INSERT INTO knowledge_source_models (organization_id, source_id, embedding_model,"
        " generation, chunk_count, chunks_stored, status) VALUES ($1, $2, $3, 1, $4, $4,"
        " 'ready')",
        organization,
        source,
        DEFAULT_MODEL,
        len(vectors),
    )
    for start in range(0, len(vectors), 2_000):
        block = vectors[start : start + 2_000]
        await admin.execute(
            "INSERT INTO knowledge_chunks (organization_id, source_id, embedding_model,"
            " generation, ordinal, text, tokens, embedding)"
            " SELECT $1, $2, $3, 1, o, 'passage ' || o, 50, e::vector"
            " FROM unnest($4::int[], $5::text[]) AS t(o, e)",
            organization,
            source,
            DEFAULT_MODEL,
            list(range(start, start + len(block))),
            [store.vector_text(v.tolist()) for v in block],
        )


def search_args(query: np.ndarray, ef_search: int) -> tuple[object, ...]:
    """knowledge_search's arguments for the vector path: the ten nearest chunks, no text."""
    vector = store.vector_text(query.tolist())
    return (DEFAULT_MODEL, vector, "", False, True, 10, None, 40, 0.0, 0.0, ef_search)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


SMOKE = {
    "chunks": 3_000,
    "organizations": 6,
    "queries": 12,
    "threshold": 1_000,
    "passages": 300,
}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py): both groups,
an indexed tenant and exact ones, in seconds."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--organizations", type=int, default=100)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threshold", type=int, default=2_000)
    parser.add_argument("--ef-search", type=int, default=200)
    parser.add_argument("--passages", type=int, default=4_000, help="git-doc passages encoded")
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, every phase: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = SentenceTransformerEncoder(
        DEFAULT_MODEL, settings.path(), backend="openvino", cache_dir=CACHE / "models"
    )
    base = base_vectors(encoder, args.passages)
    questions = [q.text for q in tuning().questions][: args.queries]
    queries = np.asarray(encoder.encode(questions), dtype=np.float32)
    rng = np.random.default_rng(8)
    counts = sizes(args.chunks, args.organizations)
    name = database_name("bench_search", args.smoke)
    seeded = await prepare(name, 0)
    try:
        admin = await asyncpg.connect(seeded.admin_url)
        tenants: list[tuple[uuid.UUID, np.ndarray]] = []
        buffers = "?"
        started = time.perf_counter()
        try:
            for count in counts:
                rows = base[rng.integers(0, len(base), count)]
                rows = rows + rng.normal(0, 0.02, rows.shape).astype(np.float32)
                rows /= np.linalg.norm(rows, axis=1, keepdims=True)
                organization = uuid.uuid4()
                await seed(admin, organization, rows)
                tenants.append((organization, rows))
            print(
                f"seeded {sum(counts):,} chunks over {len(counts)} organizations "
                f"(largest {counts[0]:,}, smallest {counts[-1]:,}) in "
                f"{time.perf_counter() - started:.0f} s"
            )
            started = time.perf_counter()
            large = [t for t in tenants if len(t[1]) >= args.threshold]
            for organization, _rows in large:
                await admin.execute(indexes.create_sql(organization, DEFAULT_MODEL, 384))
            await admin.execute("ANALYZE knowledge_chunks")
            buffers = await admin.fetchval("SHOW shared_buffers")
            print(
                f"{len(large)} tenants at or above {args.threshold:,} chunks indexed (HNSW) in "
                f"{time.perf_counter() - started:.0f} s; the other {len(tenants) - len(large)}"
                " are searched exactly"
            )
        finally:
            await admin.close()
        pool = await asyncpg.create_pool(seeded.url, min_size=1, max_size=1)
        assert pool is not None
        db = TenantDatabase(pool)
        groups = {
            "large (HNSW)": large,
            "small (exact)": [t for t in tenants if len(t[1]) < args.threshold],
        }
        try:
            print(f"shared_buffers {buffers}; each group warmed by one pass of its queries")
            for label, members in groups.items():
                if not members:
                    continue
                for i, query in enumerate(queries):  # warm: first reads come from the disk
                    async with db.scoped(members[i % len(members)][0]) as tenant:
                        await tenant.fetch(SEARCH, *search_args(query, args.ef_search))
                latencies: list[float] = []
                found = 0
                for i, query in enumerate(queries):
                    organization, rows = members[i % len(members)]
                    begun = time.perf_counter()
                    async with db.scoped(organization) as tenant:
                        hits = await tenant.fetch(SEARCH, *search_args(query, args.ef_search))
                    latencies.append((time.perf_counter() - begun) * 1000)
                    exact = set(np.argsort(-(rows @ query))[:10].tolist())
                    found += len(exact & {h["ordinal"] for h in hits})
                print(
                    f"{label:14} {len(members):3} tenants: p50 {percentile(latencies, 50):.2f} ms"
                    f"  p99 {percentile(latencies, 99):.2f} ms  recall@10 "
                    f"{found / (10 * len(queries)):.3f}  ({len(queries)} queries)"
                )
        finally:
            await pool.close()
    finally:
        await drop(seeded.stack, name)


if __name__ == "__main__":
    asyncio.run(main())
