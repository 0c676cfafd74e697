"""Builds that read knowledge, through a running build consumer: latency and the consumer's RSS.

    python -m bench.knowledge_build [--chunks 5000] [--builds 200] [--smoke]

One organization with ``--chunks`` chunks (real-derived vectors, as ``bench.search``) and its
partial HNSW index; a build consumer in its own process (the query encoder it loads is the light
OpenVINO one); builds with the knowledge source alone (both scopes, limit 8, 1,500 tokens), one
at a time, each with a real FAQ question, each followed by the same request with no source (the
transport). Then, in this process, the project's ``search()`` for the same questions twice:
interleaved with the same transport round trip (the builds' own pattern: between two searches
the broker, the consumer and this client run, and the encoder's weights and the index's pages
leave the CPU's caches) and back to back (caches warm); and the light query encoder's encode.
Printed: the round trip p50/p99 (publish to reply, the query's encode included), the
transport's p50, the encode's and both ``search()`` p50s, what the build path adds beyond each,
and the build consumer's peak RSS (VmHWM; target < 300 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
import uuid

import asyncpg
import numpy as np

from bench.corpora import CACHE, tuning
from bench.processes import peak_rss_mb, start_consumer
from bench.search import seed, tenant_vectors
from bench.seeded import database_name, drop, prepare
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import build_topics, ensure_topics
from contextcore.knowledge.adapters import indexes
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL
from contextcore.knowledge.adapters.queries import QueryVectors
from contextcore.knowledge.adapters.search import search
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.encoding import Encoder
from contextcore.storage.pool import create_pool
from contextcore.storage.tenancy import SERVICE_ROLE, TenantDatabase
from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.client import ContextClient
from schemas.context import ContextPolicy, ContextRequest, ContextSourceSpec, ContextSubject

POLICY = ContextPolicy(
    total_token_budget=1_500,
    sources=[
        ContextSourceSpec(
            name="knowledge",
            token_budget=1_500,
            limit=8,
            options={"include_platform": True, "include_organization": True},
        )
    ],
)


EMPTY = ContextPolicy(total_token_budget=100, sources=[])


class Alone:
    """The project's ``search()`` in this process (encode included, no vector cached), with
    the light query encoder the build consumer loads."""

    def __init__(self, encoder: Encoder, pool: asyncpg.Pool, organization: uuid.UUID) -> None:
        async def encoders(model: str) -> Encoder:
            return encoder

        self.encoder = encoder
        self.database = TenantDatabase(pool)
        self.vectors = QueryVectors(encoders, max_entries=0)
        self.organization = organization

    async def search_ms(self, question: str) -> float:
        started = time.perf_counter()
        await search(
            self.database,
            self.organization,
            self.vectors,
            question,
            include_platform=True,
            include_organization=True,
            limit=8,
        )
        return (time.perf_counter() - started) * 1000

    def encode_ms(self, question: str) -> float:
        started = time.perf_counter()
        self.encoder.encode([question])
        return (time.perf_counter() - started) * 1000


SMOKE = {"chunks": 500, "builds": 12, "passages": 300}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py); the figures
skip 10 warm-up builds, so a few more than that."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.knowledge_build", description=__doc__)
    parser.add_argument("--chunks", type=int, default=5_000)
    parser.add_argument("--builds", type=int, default=200)
    parser.add_argument("--passages", type=int, default=4_000, help="git-doc passages encoded")
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, every phase: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    rows = tenant_vectors(args.chunks, args.passages)
    questions = list(dict.fromkeys(q.text for q in tuning().questions))
    if args.builds > len(questions):  # a repeated question would be a cached query vector
        print(f"{len(questions)} distinct questions: {len(questions)} builds, not {args.builds}")
        args.builds = len(questions)
    name = database_name("bench_knowledge_build", args.smoke)
    seeded = await prepare(name, 0)
    organization = uuid.uuid4()
    admin = await asyncpg.connect(seeded.admin_url)
    try:
        await seed(admin, organization, rows)
        await admin.execute(indexes.create_sql(organization, DEFAULT_MODEL, 384))
        await admin.execute("ANALYZE knowledge_chunks")
    finally:
        await admin.close()
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        build_request=f"bench.{tag}.build", reply_prefix=f"bench.{tag}.reply"
    )
    bootstrap = seeded.stack.bootstrap_servers
    await ensure_topics(bootstrap, build_topics(topics))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS": str(TANSU_FETCH_MAX_WAIT_MS),
        "CONTEXTCORE_DATABASE_URL": seeded.url,
        "CONTEXTCORE_TOPIC_BUILD_REQUEST": topics.build_request,
        # the client's reply topic is under the bench's prefix: the consumer's reply-topic rule
        # must say so, or it answers nothing (broker/reply_topics.py)
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_BUILD_GROUP_ID": f"bench-{tag}",
        "CONTEXTCORE_BUILD_METRICS_PORT": "0",
        "CONTEXTCORE_BUILD_PRELOAD_ENCODER": "true",
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
    }
    consumer = start_consumer("build", env, stderr=subprocess.PIPE)
    print(f"build consumer ready, RSS {peak_rss_mb(consumer.pid):.0f} MB with the encoder loaded")
    kafka = KafkaSettings.model_construct(
        bootstrap_servers=bootstrap, fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS
    )
    latencies: list[float] = []
    transport: list[float] = []
    interleaved: list[float] = []
    items = 0
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    encoder = await asyncio.to_thread(settings.load_query_encoder, DEFAULT_MODEL)
    pool = await create_pool(seeded.url, max_size=2, session_role=SERVICE_ROLE)
    alone = Alone(encoder, pool, organization)

    def ask(i: int) -> ContextRequest:
        return ContextRequest(
            subject=ContextSubject(
                organization_id=organization, user_id=None, definition_id=None, trigger_id=None
            ),
            query=questions[i % len(questions)],
            entities=(),
        )

    try:
        async with ContextClient.from_settings(kafka, topics) as client:
            for i in range(args.builds):  # each question once: no query vector cached
                started = time.perf_counter()
                brief = await client.build(ask(i), POLICY, timeout=30)
                latencies.append((time.perf_counter() - started) * 1000)
                items += len(brief.items)
                started = time.perf_counter()  # the same hop with no source: the transport
                await client.build(ask(i), EMPTY, timeout=30)
                transport.append((time.perf_counter() - started) * 1000)
            for i in range(args.builds):  # search() in the builds' pattern
                interleaved.append(await alone.search_ms(ask(i).query))
                await client.build(ask(i), EMPTY, timeout=30)
        rss = peak_rss_mb(consumer.pid)
    finally:
        consumer.send_signal(signal.SIGTERM)
        _, err = consumer.communicate(timeout=60)
    try:
        encodes = [alone.encode_ms(questions[i % len(questions)]) for i in range(args.builds)]
        back_to_back = [await alone.search_ms(ask(i).query) for i in range(args.builds)]
    finally:
        await pool.close()
        await drop(seeded.stack, name)
    light = b"light OpenVINO query encoder cannot load" not in err
    warm, hop = latencies[10:], transport[10:]
    built, carried = float(np.percentile(warm, 50)), float(np.percentile(hop, 50))
    encode_ms = float(np.percentile(encodes[10:], 50))
    search_ms = float(np.percentile(interleaved[10:], 50))
    warm_search_ms = float(np.percentile(back_to_back[10:], 50))
    print(
        f"{args.builds} knowledge builds over {args.chunks:,} chunks: p50 {built:.1f} ms  p99 "
        f"{np.percentile(warm, 99):.1f} ms (after 10 warm-up), "
        f"{items / args.builds:.1f} chunks per brief"
    )
    print(f"the same consumer with no source (the transport): p50 {carried:.1f} ms")
    print(
        f"in process, the same questions: the query's encode p50 {encode_ms:.1f} ms (back to "
        f"back); search() alone (encode included) p50 {search_ms:.1f} ms interleaved with the "
        f"transport as the builds were, {warm_search_ms:.1f} ms back to back"
    )
    for label, alone_ms in (("interleaved", search_ms), ("back to back", warm_search_ms)):
        print(
            f"a knowledge build over search() {label}: {built - alone_ms:+.1f} ms, of which the "
            f"transport {carried:.1f} ms: the build path adds {built - alone_ms - carried:+.1f} ms"
        )
    print(
        f"build consumer peak RSS {rss:.0f} MB (target < 300 MB); query encoder: "
        f"{'OpenVINO runtime alone' if light else 'the full sentence-transformers stack'}"
    )


if __name__ == "__main__":
    asyncio.run(main())
