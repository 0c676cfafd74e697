"""The upload consumer's application.

    contextcore serve upload

It extracts and chunks in bounded worker processes (:mod:`contextcore.knowledge.adapters.sandbox`;
no model is loaded, only the model's tokenizer), so it stays small and a hostile document can
only take a worker down; the embedding group does the encoding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import upload_topics
from consumers.knowledge.upload.handler import UploadHandler
from consumers.knowledge.upload.metrics import UploadMetrics
from consumers.knowledge.upload.settings import UploadSettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from consumers.runtime.compose import Environment, consumer_app, reply_channel
from consumers.runtime.database import handler_database
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.knowledge.adapters.objects import ObjectReader
from contextcore.knowledge.adapters.sandbox import SandboxLimits, TextSandbox
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.adapters.store import PostgresKnowledgeRepository
from contextcore.knowledge.extract import Limits
from contextcore.knowledge.ingest import Ingestion
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import TenantDatabase
from schemas.upload import EmbedBatchV1, UploadStatusV1, UploadTopicV1

DESCRIPTION = (
    "Admin document uploads for the knowledge base (inline, s3:// or file://). Each is answered "
    "on its reply_to with its correlation_id: pending (accepted), failed (with the reason) or "
    "rejected; ready follows from the embedding group once every chunk is stored, or "
    "superseded when a later upload of the same document replaced it first."
)


def create_app(
    upload: UploadSettings | None = None,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    database: DatabaseSettings | None = None,
    knowledge: KnowledgeSettings | None = None,
) -> ConsumerApp:
    env = Environment.of(kafka, topics, database)
    settings = upload or UploadSettings()
    knowledge = knowledge or KnowledgeSettings()

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, publisher: Publisher
    ) -> AsyncIterator[UploadHandler]:
        sandbox = TextSandbox(workers=settings.extract_workers, limits=sandbox_limits(settings))
        try:
            async with handler_database(env.database) as db:
                yield UploadHandler(
                    ingestion(settings, knowledge, db.tenants, sandbox),
                    publisher,
                    env.topics.embed,
                    UploadMetrics.create(metrics.registry),
                    reply_topics=env.reply_topics,
                    max_attempts=settings.max_attempts,
                    max_record_bytes=env.kafka.max_record_bytes,
                    position=db.position,
                )
        finally:
            await sandbox.close()

    return consumer_app(
        env,
        name="upload",
        topic=env.topics.upload,
        topics=upload_topics(env.topics),
        settings=settings,
        description=DESCRIPTION,
        payload=UploadTopicV1,
        publishes=[
            reply_channel(
                "upload-status",
                "The status of one upload, on the topic it named, with its correlation_id.",
                UploadStatusV1,
            ),
            Channel(
                env.topics.embed,
                env.topics.embed,
                "Batches of chunks of one generation of one source, for the embedding group.",
                EmbedBatchV1,
            ),
        ],
        open_handler=open_handler,
        dead_letter_causes=("refused",),
        retry_causes=("object_store",),
    )


def sandbox_limits(upload: UploadSettings) -> SandboxLimits:
    """What one extraction may take, out of process (contextcore/knowledge/adapters/sandbox.py)."""
    return SandboxLimits(
        memory_mb=upload.extract_memory_mb,
        cpu_s=upload.extract_cpu_s,
        wall_s=upload.extract_wall_s,
        output_mb=upload.extract_output_mb,
    )


def ingestion(
    upload: UploadSettings,
    knowledge: KnowledgeSettings,
    tenants: TenantDatabase,
    sandbox: TextSandbox,
) -> Ingestion:
    """The ingestion of one process: its repository, the object reader its settings allow, the
    sandbox, and the limits of one document."""
    reader = ObjectReader(
        max_bytes=upload.max_document_bytes,
        file_root=upload.file_root,
        buckets=upload.s3_buckets,
        s3_endpoint_url=upload.s3_endpoint_url,
        s3_region=upload.s3_region,
        tenant_prefixes=upload.s3_tenant_prefixes,
    )
    return Ingestion(
        PostgresKnowledgeRepository(tenants),
        reader,
        sandbox,
        knowledge.model_windows(),
        limits=Limits(
            max_bytes=upload.max_document_bytes,
            max_chars=upload.max_document_chars,
            max_pages=upload.max_pdf_pages,
            max_chunks=upload.max_document_chunks,
        ),
        batch_size=upload.embed_batch_chunks,
    )
