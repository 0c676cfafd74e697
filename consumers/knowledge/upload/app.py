"""The upload consumer's application.

    contextcore serve upload

It extracts and chunks in bounded worker processes (:mod:`contextcore.knowledge.adapters.sandbox`;
no model is loaded, only the model's tokenizer), so it stays small and a hostile document can
only take a worker down; the embedding group does the encoding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from broker.reply_topics import ReplyTopics
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import upload_topics
from consumers.knowledge.upload.handler import UploadHandler
from consumers.knowledge.upload.metrics import UploadMetrics
from consumers.knowledge.upload.settings import UploadSettings
from consumers.runtime.app import ConsumerApp
from consumers.runtime.asyncapi import Channel
from consumers.runtime.database import verified_pool
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.transport import Publisher
from contextcore.knowledge.adapters.objects import ObjectReader
from contextcore.knowledge.adapters.sandbox import SandboxLimits, TextSandbox
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.knowledge.adapters.store import PostgresKnowledgeRepository
from contextcore.knowledge.extract import Limits
from contextcore.knowledge.ingest import Ingestion
from contextcore.settings import DatabaseSettings
from contextcore.storage.positions import write_position
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
    upload = upload or UploadSettings()
    kafka = kafka or KafkaSettings()
    topics = topics or TopicSettings()
    database = database or DatabaseSettings()
    knowledge = knowledge or KnowledgeSettings()
    reply_topics = ReplyTopics.of(topics)

    @asynccontextmanager
    async def open_handler(
        metrics: RuntimeMetrics, publisher: Publisher
    ) -> AsyncIterator[UploadHandler]:
        sandbox = TextSandbox(
            workers=upload.extract_workers,
            limits=SandboxLimits(
                memory_mb=upload.extract_memory_mb,
                cpu_s=upload.extract_cpu_s,
                wall_s=upload.extract_wall_s,
                output_mb=upload.extract_output_mb,
            ),
        )
        async with verified_pool(database) as pool:
            reader = ObjectReader(
                max_bytes=upload.max_document_bytes,
                file_root=upload.file_root,
                buckets=upload.s3_buckets,
                s3_endpoint_url=upload.s3_endpoint_url,
                s3_region=upload.s3_region,
                tenant_prefixes=upload.s3_tenant_prefixes,
            )
            ingestion = Ingestion(
                PostgresKnowledgeRepository(TenantDatabase(pool, role=database.role)),
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
            try:
                yield UploadHandler(
                    ingestion,
                    publisher,
                    topics.embed,
                    UploadMetrics.create(metrics.registry),
                    reply_topics=reply_topics,
                    max_attempts=upload.max_attempts,
                    max_record_bytes=kafka.max_record_bytes,
                    position=partial(write_position, pool),
                )
            finally:
                await sandbox.close()

    return ConsumerApp(
        name="upload",
        topic=topics.upload,
        description=DESCRIPTION,
        payload=UploadTopicV1,
        publishes=[
            Channel(
                "{reply_to}",
                "upload-status",
                "The status of one upload, on the topic it named, with its correlation_id.",
                UploadStatusV1,
            ),
            Channel(
                topics.embed,
                topics.embed,
                "Batches of chunks of one generation of one source, for the embedding group.",
                EmbedBatchV1,
            ),
        ],
        settings=upload,
        kafka=kafka,
        database=database,
        topics=upload_topics(topics),
        reply_topics=reply_topics,
        open_handler=open_handler,
        dead_letter_causes=("refused",),
        retry_causes=("object_store",),
    )
