"""Ingestion end to end against the model alone, on the same machine in the same run.

    python -m bench.ingest [--documents 60] [--backend openvino]
    python -m bench.ingest --small 4000     # many one-passage documents instead
    python -m bench.ingest --encoder-cores 1  # the embedding group on cores of its own
    python -m bench.ingest --smoke            # every phase at tiny sizes, in seconds

Uploads real documentation (git's HTML manual pages, package ``git-doc``, fetched by
``bench.corpora``) through the upload topic to a running upload consumer and embedding consumer
(their own processes, on the embedded stack), timing from the first upload published to the
last ``ready`` reply. Then, with the consumers stopped, the bench process encodes the very
chunks the pipeline stored (their text, as the embedding group embeds them), all of them
in one call, on the configured backend and on torch fp32 (the encoder LangChain's and
LlamaIndex's sentence-transformers integrations use): once with sentence-transformers alone, as
a user would, and once through our encoder, whose batches cut by word pieces make it the fastest
raw encode here (the strictest baseline).

Printed: documents, chunks and passages per second of the pipeline; raw encode rates; the two
ratios (pipeline / raw configured backend, target >= 0.9, >= 0.8 with ``--small``, to both of
its baselines; pipeline / sentence-transformers on torch fp32, target >= 2.5); the CPU seconds
each process used while ingesting; and the peak RSS of each consumer process (VmHWM).

``--encoder-cores N`` gives the embedding consumer, and then the raw encode, the last N cores of
the machine to themselves, and every other process (the upload consumer, PostgreSQL, the
broker, this bench) the rest: the embedding group as deployed, on machines of its own, where
extraction, the database and the broker take nothing from the encoder. Without it every process
shares every core, and on a small machine each of them is taken from the encoder.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import time
import uuid
from collections.abc import Callable

import asyncpg

from bench.corpora import CACHE, fetch, held_out
from bench.memory import WAL_NOW, WAL_SINCE
from bench.processes import (
    machine_busy_seconds,
    peak_rss_mb,
    pin,
    start_consumer,
    tree_cpu_seconds,
)
from bench.quality import cpu_flags
from bench.seeded import database_name, drop, prepare
from broker.settings import TopicSettings
from broker.topics import ensure_topics, upload_topics
from contextcore.knowledge.adapters.encoder import DEFAULT_MODEL, SentenceTransformerEncoder
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from devstack.stack import DevStack


def documents(count: int) -> list[tuple[str, bytes]]:
    pages = sorted((fetch() / "git-doc").glob("git-*.html"))[:count]
    return [(page.stem, page.read_bytes()) for page in pages]


def passages(count: int, pages: int | None = None) -> list[tuple[str, bytes]]:
    """``count`` passages of the Python documentation (the held-out set's documents, of its
    first ``pages`` pages per folder if given), each a document of its own, as a help centre's
    articles are uploaded one by one."""
    documents = held_out(pages).documents
    return [(f"passage-{i:05d}", d.text.encode()) for i, d in enumerate(documents)][:count]


SMOKE = {"documents": 2}
"""``--smoke``: the sizes of a smoke run (tests/integration/test_bench_smoke.py)."""


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__)
    parser.add_argument("--documents", type=int, default=60)
    parser.add_argument("--small", type=int, default=0, help="that many one-passage documents")
    parser.add_argument("--backend", default="openvino")
    parser.add_argument("--embed-in-flight", type=int, default=None, help="default: the setting's")
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=100,
        help="the consumers' and the reply reader's fetch wait (the dev stack's 2 ms polls Tansu "
        "500 times a second, which costs the encoder CPU)",
    )
    parser.add_argument(
        "--encoder-cores",
        type=int,
        default=0,
        help="that many cores for the embedding consumer and the raw encode alone (default: all "
        "processes share all cores)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, every phase: {SMOKE} (a size given wins)"
    )
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given; its figures mean little
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    everything = sorted(os.sched_getaffinity(0))
    if not 0 <= args.encoder_cores < len(everything):
        parser.error(f"--encoder-cores must leave a core of the {len(everything)} to the rest")
    encoder_cores = set(everything[len(everything) - args.encoder_cores :])
    rest = set(everything) - encoder_cores
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    database = database_name("bench_ingest", args.smoke)
    seeded = await prepare(database, 0)
    organization = uuid.uuid4()
    admin = await asyncpg.connect(seeded.admin_url)
    await admin.execute("INSERT INTO organizations (id, name) VALUES ($1, 'bench')", organization)
    tag = uuid.uuid4().hex[:8]
    topics = TopicSettings.model_construct(
        upload=f"bench.{tag}.upload", embed=f"bench.{tag}.embed", reply_prefix=f"bench.{tag}.reply"
    )
    bootstrap = seeded.stack.bootstrap_servers
    await ensure_topics(bootstrap, upload_topics(topics))
    reply_topic = f"{topics.reply_prefix}.uploader"
    from broker.topics import TopicSpec

    await ensure_topics(bootstrap, [TopicSpec(reply_topic, 1)])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONTEXTCORE_")},
        "CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "CONTEXTCORE_UPLOAD_FETCH_MAX_WAIT_MS": str(args.fetch_max_wait_ms),
        "CONTEXTCORE_EMBED_FETCH_MAX_WAIT_MS": str(args.fetch_max_wait_ms),
        "CONTEXTCORE_DATABASE_URL": seeded.url,
        "CONTEXTCORE_TOPIC_UPLOAD": topics.upload,
        "CONTEXTCORE_TOPIC_EMBED": topics.embed,
        # the reply-topic rule: the uploader's reply topic is under this prefix, and neither
        # consumer answers (nor the embedding group says ready to) a topic outside it
        "CONTEXTCORE_TOPIC_REPLY_PREFIX": topics.reply_prefix,
        "CONTEXTCORE_UPLOAD_GROUP_ID": f"bench-{tag}-upload",
        "CONTEXTCORE_UPLOAD_METRICS_PORT": "0",
        "CONTEXTCORE_EMBED_GROUP_ID": f"bench-{tag}-embed",
        "CONTEXTCORE_EMBED_METRICS_PORT": "0",
        "CONTEXTCORE_KNOWLEDGE_BACKEND": args.backend,
        "CONTEXTCORE_KNOWLEDGE_CACHE_DIR": str(CACHE / "models"),
    }
    if args.embed_in_flight is not None:
        env["CONTEXTCORE_EMBED_MAX_IN_FLIGHT"] = str(args.embed_in_flight)
    docs = (
        passages(args.small, 2 if args.smoke else None) if args.small else documents(args.documents)
    )
    media_type = "text/plain" if args.small else "text/html"
    print(f"{len(docs)} documents, {sum(len(d) for _, d in docs) / 1e6:.1f} MB of {media_type}")
    stack = DevStack()
    servers = {
        "PostgreSQL": int((stack.pg_data / "postmaster.pid").read_text().split()[0]),
        "Tansu": int(stack.broker_pid_file.read_text()),
    }
    if encoder_cores:  # before the consumers start: pin() moves a process's descendants too
        for pid in (*servers.values(), os.getpid()):
            pin(pid, rest)
    upload = start_consumer("upload", env, cores=rest if encoder_cores else None)
    embed = start_consumer("embed", env, cores=encoder_cores or None)
    if encoder_cores:
        print(
            f"cores: embedding consumer {sorted(os.sched_getaffinity(embed.pid))}, upload"
            f" consumer {sorted(os.sched_getaffinity(upload.pid))}, the rest {sorted(rest)}"
        )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": args.fetch_max_wait_ms,
        }
    )
    reader.assign([TopicPartition(reply_topic, 0, OFFSET_BEGINNING)])
    processes = {"upload consumer": upload.pid, "embedding consumer": embed.pid, **servers}
    try:
        cpu_before = {name: tree_cpu_seconds(pid) for name, pid in processes.items()}
        busy_before, all_before = machine_busy_seconds()
        bench_before = time.process_time()
        wal = await admin.fetchval(WAL_NOW)
        started = time.perf_counter()
        for stem, html in docs:
            message = {
                "correlation_id": stem,
                "reply_to": reply_topic,
                "scope": "organization",
                "organization_id": str(organization),
                "title": stem,
                "media_type": media_type,
                "idempotency_key": f"{tag}-{stem}",
                "uri": f"bench://{stem}",
                "content": {"text": html.decode()},
            }
            producer.produce(topics.upload, json.dumps(message).encode(), key=stem.encode())
        producer.flush(60)
        final: dict[str, str] = {}
        deadline = time.monotonic() + 3_600
        while len(final) < len(docs) and time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is None or record.error() is not None:
                continue
            status = json.loads(record.value() or b"{}")
            if status["status"] in {"ready", "failed", "rejected"}:
                final[status["correlation_id"]] = status["status"]
                if status["status"] != "ready":
                    print(f"  {status['correlation_id']}: {status['status']}: {status['reason']}")
        elapsed = time.perf_counter() - started
        busy_after, all_after = machine_busy_seconds()
        cpu = {name: tree_cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
        cpu["this bench"] = time.process_time() - bench_before
        rss = {"upload": peak_rss_mb(upload.pid), "embed": peak_rss_mb(embed.pid)}
        wal_bytes = await admin.fetchval(WAL_SINCE, wal)
    finally:
        reader.close()
        for process in (upload, embed):
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    rows = await admin.fetch("SELECT text FROM knowledge_chunks ORDER BY id")
    stored = await admin.fetchval(
        "SELECT pg_total_relation_size('knowledge_chunks') + pg_total_relation_size("
        "'knowledge_sources')"
    )
    await admin.close()
    texts = [r["text"] for r in rows]
    ready = sum(1 for s in final.values() if s == "ready")
    print(
        f"pipeline: {ready}/{len(docs)} ready, {len(texts)} chunks in {elapsed:.1f} s: "
        f"{len(docs) / elapsed:.2f} documents/s, {len(texts) / elapsed:.1f} chunks/s; "
        f"WAL {wal_bytes / max(len(texts), 1):,.0f} bytes a chunk, stored "
        f"{stored / max(len(texts), 1):,.0f} bytes a chunk (chunks and sources, indexes "
        "included)"
    )
    cores = (all_after - all_before) / elapsed
    print(
        f"CPU while ingesting: {busy_after - busy_before:.1f} of {all_after - all_before:.1f} "
        f"core-seconds busy ({cores:.0f} cores); by process: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in cpu.items())
    )
    if encoder_cores:  # the raw encode on the embedding consumer's cores, with as many threads
        for pid in (processes["PostgreSQL"], processes["Tansu"]):
            pin(pid, set(everything))
        pin(os.getpid(), encoder_cores)
        import torch

        torch.set_num_threads(len(encoder_cores))
    settings = KnowledgeSettings.model_construct(cache_dir=CACHE / "models")
    rates = {}
    for backend in dict.fromkeys([args.backend, "torch"]):
        encoder = SentenceTransformerEncoder(
            DEFAULT_MODEL, settings.path(), backend=backend, cache_dir=CACHE / "models"
        )
        plain = encoder.sentence_transformer
        encoder.encode(texts[:64])  # warm
        runs: dict[str, Callable[[list[str]], object]] = {
            # every chunk in one call, as a user of sentence-transformers would encode them
            f"sentence-transformers, {backend}": functools.partial(plain.encode, batch_size=32),
            # the same call through our encoder (batches cut by word pieces): the fastest raw
            # encode of this model here, so the strictest baseline
            f"our encoder, {backend}": encoder.encode,
        }
        for name, encode in runs.items():
            begun = time.perf_counter()
            encode(texts)
            rates[name] = len(texts) / (time.perf_counter() - begun)
            print(f"raw encode, {name} ({encoder.backend}): {rates[name]:.1f} passages/s")
    pipeline = len(texts) / elapsed
    target = 0.8 if args.small else 0.9  # issue 18: many small documents, and large ones
    print(f"CPU flags: {cpu_flags() or 'none of avx512_bf16, amx_bf16, amx_int8, amx_tile'}")
    for name in (f"our encoder, {args.backend}", f"sentence-transformers, {args.backend}"):
        print(f"pipeline / raw {name}: {pipeline / rates[name]:.2f} (target >= {target})")
    print(
        "pipeline / raw sentence-transformers, torch fp32 (what LangChain and LlamaIndex run): "
        f"{pipeline / rates['sentence-transformers, torch']:.2f} (target >= 2.5)"
    )
    print(
        f"peak RSS: upload consumer {rss['upload']:.0f} MB, embedding consumer "
        f"{rss['embed']:.0f} MB (target < 1,500 MB)"
    )
    await drop(seeded.stack, database)
    if args.smoke and ready < len(docs):
        raise SystemExit(f"smoke: {len(docs) - ready} of {len(docs)} documents not ready")


if __name__ == "__main__":
    asyncio.run(main())
