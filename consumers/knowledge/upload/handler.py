"""One upload, one outcome.

1. Decode and validate (``schemas.upload``). A ``reply_to`` the reply-topic rule refuses is
   never answered: the record is dead-lettered (``reply_to_refused``) and nothing is stored.
   An invalid upload with a usable address is answered ``rejected``; without one it is
   dead-lettered.
2. :meth:`~contextcore.knowledge.ingest.Ingestion.prepare`: the source row, the text, the
   chunks (a reason to fail becomes a ``failed`` source, not an error of the consumer). An
   address refused before anything is stored is answered ``rejected``. An object store that
   does not answer is a bounded retry, and its last attempt fails the source with the reason.
3. Publish the embedding batches, each acknowledged by the broker before the reply; a publish
   that fails raises, and the runtime retries the record (the batches of a redelivered upload
   are published again, and the embedding group stores each chunk once). Every batch is made
   and checked before the first is published: a batch is cut in halves until its record fits
   the broker's record limit (``max_record_bytes``) and the wire's
   :data:`~schemas.upload.MAX_BATCH_CHARS`; a chunk that cannot be a record even alone fails the
   source at once, with the reason (a retry would cut it the same way).
4. Reply the source's status (``pending``, or ``failed`` with the reason), or ``superseded``
   when a later upload of the same document replaced this one's generation. An upload for an
   organization the database does not hold is ``rejected`` ("no such organization"), at once.

An upload that replaces a generation still pending also tells that generation's uploader
``superseded`` (:meth:`UploadHandler.tell_superseded`), on the address the source row is
about to forget (if the rule allows it): nobody else could tell it any more.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

from pydantic import ValidationError

from broker.lanes import organization_header
from broker.reply_topics import ReplyTopics
from broker.tracing import trace_headers
from consumers.knowledge.replies import rejected, reply, status_of, superseded, tell
from consumers.knowledge.upload.metrics import UploadMetrics
from consumers.runtime.decoding import decode_request
from consumers.runtime.logs import bind_correlation_id
from consumers.runtime.records import (
    DeadLetter,
    Done,
    Inbound,
    Outcome,
    Reply,
    Retry,
    Stopwatch,
)
from consumers.runtime.transport import Publisher
from contextcore.knowledge.addresses import ObjectError, ObjectUnavailable
from contextcore.knowledge.ingest import (
    Batch,
    Ingestion,
    Prepared,
    Reingest,
    Upload,
    UploadRefused,
)
from contextcore.knowledge.state import Superseded
from contextcore.storage.positions import WritePosition
from schemas import wire
from schemas.errors import ContextcoreError, validation_lines
from schemas.upload import (
    MAX_BATCH_CHARS,
    EmbedBatchV1,
    EmbedChunkV1,
    ReingestRequestV1,
    UploadRequestV1,
    UploadStatusV1,
    parse_upload_topic,
)

log = logging.getLogger("contextcore.upload")


class Unstorable(ContextcoreError):
    """A document's chunks cannot be carried to the embedding group (the reason says why, to a
    person): its source fails at once instead of being retried into a dead letter."""


class UploadHandler:
    def __init__(
        self,
        ingestion: Ingestion,
        publisher: Publisher,
        embed_topic: str,
        metrics: UploadMetrics,
        *,
        reply_topics: ReplyTopics,
        max_attempts: int = 4,
        max_record_bytes: int = 1_000_000,
        position: WritePosition | None = None,
    ) -> None:
        """``reply_topics``: the rule every ``reply_to`` passes, at intake and in
        :meth:`tell_superseded`. ``max_attempts``: the runtime's; the last attempt of an upload
        whose object store does not answer fails its source (the uploader hears why) instead of
        a dead letter. ``max_record_bytes``: the broker's record limit, which every batch's
        record fits. ``position``: the primary's log position, which a ``ready`` status
        carries (read-your-writes)."""
        self.ingestion = ingestion
        self.position = position
        self.publisher = publisher
        self.embed_topic = embed_topic
        self.metrics = metrics
        self.reply_topics = reply_topics
        self.max_attempts = max_attempts
        self.max_record_bytes = max_record_bytes

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        with watch.stage("decode"):
            decoded = self.decode(record.value)
        if isinstance(decoded, ReingestRequestV1 | UploadRequestV1) and decoded.correlation_id:
            bind_correlation_id(decoded.correlation_id)  # this record's log lines name it
        if isinstance(decoded, ReingestRequestV1):
            return await self.reingest(decoded, watch)
        if not isinstance(decoded, UploadRequestV1):
            self.metrics.uploads.labels(outcome="rejected").inc()
            return decoded
        upload = Upload(
            organization_id=decoded.organization_id,
            title=decoded.title,
            media_type=decoded.media_type,
            upload_key=decoded.idempotency_key,
            uri=decoded.uri,
            object=decoded.object,
            text=decoded.content.text if decoded.content else None,
            base64=decoded.content.base64 if decoded.content else None,
            reply_to=decoded.reply_to,
            correlation_id=decoded.correlation_id,
        )
        try:
            with watch.stage("prepare"):
                prepared = await self.ingestion.prepare(
                    upload,
                    last_attempt=record.attempt >= self.max_attempts,
                    replaced=self.tell_superseded,
                )
        except ObjectUnavailable as error:
            return Retry("object_store", str(error))
        except (ObjectError, UploadRefused) as error:  # refused before anything was stored
            self.metrics.uploads.labels(outcome="rejected").inc()
            return reply(
                decoded.reply_to,
                decoded.correlation_id,
                rejected(decoded.correlation_id, str(error)),
            )
        with watch.stage("publish_batches"):
            try:
                records = self.records(prepared.batches)
            except Unstorable as error:
                prepared = await self.ingestion.give_up(prepared, str(error))
                records = []
            for key, value, organization in records:
                await self.publish(key, value, organization)
        status = await self.status_for(prepared, decoded.correlation_id)
        self.metrics.uploads.labels(outcome=status.status).inc()
        self.metrics.batches_published.inc(len(prepared.batches))
        return reply(decoded.reply_to, decoded.correlation_id, status)

    async def reingest(self, command: ReingestRequestV1, watch: Stopwatch) -> Outcome:
        with watch.stage("prepare"):
            prepared = await self.ingestion.reingest(
                Reingest(
                    organization_id=command.organization_id,
                    source_id=command.source_id,
                    key=command.idempotency_key,
                    models=tuple(command.models) if command.models else None,
                    reply_to=command.reply_to,
                    correlation_id=command.correlation_id,
                ),
                replaced=self.tell_superseded,
            )
        if not isinstance(prepared, str):
            with watch.stage("publish_batches"):
                try:
                    records = self.records(prepared.batches)
                except Unstorable as error:
                    if command.models is not None:  # a switch's chunks: the source stays as is
                        prepared = str(error)
                    else:
                        prepared = await self.ingestion.give_up(prepared, str(error))
                    records = []
                for key, value, organization in records:
                    await self.publish(key, value, organization)
        if isinstance(prepared, str):
            self.metrics.uploads.labels(outcome="rejected").inc()
            if command.reply_to is None or command.correlation_id is None:
                return DeadLetter("refused", f"reingest of {command.source_id}: {prepared}")
            message = rejected(command.correlation_id, prepared)
            return reply(command.reply_to, command.correlation_id, message)
        self.metrics.batches_published.inc(len(prepared.batches))
        if command.reply_to is None or command.correlation_id is None:
            return Done()
        status = await self.status_for(prepared, command.correlation_id)
        return reply(command.reply_to, command.correlation_id, status)

    async def status_for(self, prepared: Prepared, correlation_id: str) -> UploadStatusV1:
        """:func:`answer`, and a ``ready`` one with the primary's log position."""
        status = answer(prepared, correlation_id)
        if status.status != "ready" or self.position is None:
            return status
        return status.model_copy(update={"position": await self.position()})

    async def tell_superseded(self, replaced: Superseded) -> None:
        """Tell the uploader of a pending generation this record's upload replaced: its final
        status, ``superseded``. Awaited as soon as the accept commits, before anything else can
        fail. A publish the broker refuses, or to a topic the rule refuses, is logged, not
        retried: a redelivered record would no longer know the address (the uploader's client
        then times out)."""
        if replaced.reply_to is None or replaced.correlation_id is None:
            return
        message = superseded(replaced, replaced.correlation_id)
        why = await tell(self.publisher, self.reply_topics, replaced.reply_to, message)
        if why is not None:
            log.warning("could not tell %s it was superseded: %s", replaced.reply_to, why)

    def records(self, batches: Sequence[Batch]) -> list[tuple[bytes, bytes, UUID | None]]:
        """Every batch as the records (key, value, organization) that carry it, each under the
        record limit.

        Raises:
            Unstorable: a chunk is not one the embedding group accepts, or its record alone
                is over the limit.
        """
        records: list[tuple[bytes, bytes, UUID | None]] = []
        for batch in batches:
            chunks = []
            for chunk in batch.chunks:
                try:
                    chunks.append(EmbedChunkV1.model_validate(chunk, from_attributes=True))
                except ValidationError as error:
                    problem = "; ".join(validation_lines(error))[:300]
                    raise Unstorable(
                        f"the document cannot be stored: its passage {chunk.ordinal} is not "
                        f"one the embedding step takes ({problem})"
                    ) from None
            key = str(batch.source_id).encode()
            records.extend(
                (key, value, batch.organization_id) for value in self._cut(batch, chunks)
            )
        return records

    def _cut(self, batch: Batch, chunks: list[EmbedChunkV1]) -> list[bytes]:
        """The values of ``batch``'s chunks, halved until each fits (deterministic: a
        redelivered upload publishes the same records)."""
        if len(chunks) > 1 and sum(chunk.chars for chunk in chunks) > MAX_BATCH_CHARS:
            value = None
        else:
            value = (
                EmbedBatchV1(
                    organization_id=batch.organization_id,
                    source_id=batch.source_id,
                    generation=batch.generation,
                    embedding_model=batch.model,
                    chunks=chunks,
                )
                .model_dump_json()
                .encode()
            )
            if len(value) <= self.max_record_bytes:
                return [value]
            if len(chunks) == 1:
                raise Unstorable(
                    f"the document cannot be stored: its passage {chunks[0].ordinal} makes a "
                    f"record of {len(value):,} bytes, over the {self.max_record_bytes:,}-byte "
                    "limit of the broker"
                )
        half = len(chunks) // 2
        return self._cut(batch, chunks[:half]) + self._cut(batch, chunks[half:])

    async def publish(self, key: bytes, value: bytes, organization: UUID | None) -> None:
        await self.publisher.publish(
            self.embed_topic,
            value,
            key=key,
            headers=[
                ("content-type", b"application/json"),
                # the embedding group serves each organization's batches in turn
                organization_header(organization),
                # the upload's span: the embedding group continues its trace, to the last batch
                *trace_headers(),
            ],
        )

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """A ``rejected`` status for an upload the runtime gave up on (a source it created
        stays pending until the sweep fails it, and tells the uploader again)."""
        address = wire.address_of(record.value)
        if address is None:
            return None
        topic, correlation_id = address
        message = rejected(correlation_id, f"the upload was not handled: {reason}")
        return reply(topic, correlation_id, message)

    def decode(
        self, value: bytes | None
    ) -> UploadRequestV1 | ReingestRequestV1 | Reply | DeadLetter:
        return decode_request(
            value, parse_upload_topic, "upload", _refuse, reply_topics=self.reply_topics
        )


def answer(prepared: Prepared, correlation_id: str) -> UploadStatusV1:
    """What an upload (or a retry) hears now: ``superseded`` when a later one replaced its
    generation, else the source's status."""
    if prepared.superseded is not None:
        return superseded(prepared.superseded, correlation_id)
    return status_of(prepared.source, correlation_id)


def _refuse(
    topic: str, correlation_id: str, message: str, details: list[str], _data: object
) -> Reply:
    return reply(topic, correlation_id, rejected(correlation_id, message, details))
