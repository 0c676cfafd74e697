"""One embedding batch, one outcome.

Decode and validate (an invalid batch, which only a bug or a forger writes, is dead-lettered);
encode and store (:class:`~contextcore.knowledge.embed.Embedder`). The batch that completes its
source under the live model answers the uploader ``ready`` on the reply topic the upload named;
the first batch that finds its source deleted while pending answers it ``failed`` ("the
document was deleted"); a batch the store refuses for good fails its source at once and
answers it ``failed`` with the reason.
A batch for a model this process does not encode with is dead-lettered with the reason (its
source stays pending, and the sweep fails it with the count of chunks stored).
"""

from __future__ import annotations

import time

from pydantic import ValidationError

from consumers.knowledge.embed.metrics import EmbedMetrics
from consumers.knowledge.replies import reply, status_of
from consumers.runtime.records import DeadLetter, Done, Inbound, Outcome, Reply, Stopwatch
from contextcore.knowledge.chunk import Chunk
from contextcore.knowledge.embed import Embedder, UnknownModel
from contextcore.storage.positions import WritePosition
from schemas import wire
from schemas.envelope import printable
from schemas.errors import validation_lines
from schemas.upload import EmbedBatchV1


class EmbedHandler:
    def __init__(
        self,
        embedder: Embedder,
        metrics: EmbedMetrics,
        *,
        position: WritePosition | None = None,
    ) -> None:
        """``position``: the primary's log position, asked once a source is ready, which its
        ``ready`` status carries (read-your-writes)."""
        self.embedder = embedder
        self.metrics = metrics
        self.position = position

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        with watch.stage("decode"):
            try:
                batch = EmbedBatchV1.model_validate(wire.decode(record.value))
            except wire.WireError as error:
                return DeadLetter(error.cause, str(error))
            except ValidationError as error:
                lines = [printable(line) for line in validation_lines(error)]
                return DeadLetter("invalid", "invalid embedding batch: " + "; ".join(lines)[:2_000])
        started = time.perf_counter()
        try:
            with watch.stage("embed"):
                result = await self.embedder.embed(
                    batch.organization_id,
                    batch.source_id,
                    batch.generation,
                    batch.embedding_model,
                    [Chunk(**chunk.model_dump()) for chunk in batch.chunks],
                )
        except UnknownModel as error:
            return DeadLetter("unknown_model", str(error))
        self.metrics.batch_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_size.observe(len(batch.chunks))
        self.metrics.chunks.labels(model=batch.embedding_model).inc(result.inserted)
        for told in (result.deleted, result.failed):
            if told is not None and told.reply_to and told.correlation_id:
                return reply(
                    told.reply_to, told.correlation_id, status_of(told, told.correlation_id)
                )
        source = result.source
        if source is None:
            return Done()
        self.metrics.sources_ready.inc()
        if source.reply_to is None or source.correlation_id is None:
            return Done()
        position = None if self.position is None else await self.position()
        status = status_of(source, source.correlation_id, position=position)
        return reply(source.reply_to, source.correlation_id, status)

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """Nobody waits on an embedding batch: its source stays pending, and the sweep fails
        it with the count of chunks stored."""
        return None
