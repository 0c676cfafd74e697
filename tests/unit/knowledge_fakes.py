"""The knowledge tables, an object store, a text cutter, a chunk store, an encoder and the
sweep's tables in memory: fakes of the ports of contextcore/knowledge/ingest.py and embed.py and
of consumers/knowledge/sweep/app.py, for Ingestion's and the Sweeper's unit tests and the
upload, embed and sweep in-memory behaviour run (tests/behaviour/), on a clock the test can
move."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

from contextcore.knowledge.adapters.store import SourceCounts, Swept
from contextcore.knowledge.addresses import ObjectAddress, ObjectError, ObjectUnavailable
from contextcore.knowledge.chunk import Chunk, ChunkSettings, Cut, ModelWindow
from contextcore.knowledge.extract import ExtractionError, Limits, Section
from contextcore.knowledge.ingest import NewSource, Opened, OverQuota
from contextcore.knowledge.state import Accepted, BatchResult, SourceState, Superseded
from contextcore.quotas import NO_QUOTAS

LIVE, NEXT = "small-model", "large-model"


class Clock:
    """The fakes' now: the real time, plus however far the test moved it on."""

    def __init__(self) -> None:
        self.moved = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.moved

    def advance(self, seconds: float) -> None:
        self.moved += timedelta(seconds=seconds)


class Sources:
    """The knowledge tables as a dict: a source per identity, its generations, the claimed keys
    and the scope's models, with the rules the SQL keeps (store.py). ``pending_since``: when
    each source's current generation started, on ``clock``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.pending_since: dict[UUID, datetime] = {}
        self.rows: dict[UUID, SourceState] = {}
        self.identity: dict[str, UUID] = {}
        self.claimed: set[str] = set()
        self.expected: dict[tuple[UUID, int], dict[str, int]] = {}
        self.live, self.next = LIVE, None  # type: tuple[str, str | None]
        self.calls: list[str] = []
        self.quotas = NO_QUOTAS

    def _opened(
        self, claimed: bool, started: Accepted | None, source: SourceState | None
    ) -> Opened:
        return Opened(claimed, started, source, self.live, self.next, self.quotas)

    def _start(self, old: SourceState, key: str, reply_to: str | None, cid: str | None, *,
               sections: list[Section] | None) -> Accepted:  # fmt: skip
        """The next generation of ``old``; the pending one it replaced, when its uploader waits
        on another address."""
        replaced = None
        if old.status == "pending" and None not in (old.reply_to, old.correlation_id) and (
            old.reply_to, old.correlation_id) != (reply_to, cid):  # fmt: skip
            replaced = Superseded(old.id, old.generation + 1, old.generation, old.reply_to,
                                  old.correlation_id)  # fmt: skip
        self.rows[old.id] = replace(
            old, generation=old.generation + 1, status="pending", status_reason=None,
            reply_to=reply_to, correlation_id=cid, upload_key=key, sections=sections,
        )  # fmt: skip
        self.pending_since[old.id] = self.clock.now()
        return Accepted(old.id, old.generation + 1, replaced)

    async def open_upload(
        self, organization_id: UUID | None, upload_key: str, new: NewSource
    ) -> Opened:
        self.calls.append("open_upload")
        identity = new.uri or new.object_key
        if upload_key in self.claimed:
            found = self.identity.get(identity) if identity else None
            return self._opened(False, None, None if found is None else self.rows.get(found))
        in_flight = self.quotas.uploads_in_flight
        others = [r for r in self.rows.values() if r.status == "pending"
                  and (not identity or self.identity.get(identity) != r.id)]  # fmt: skip
        if in_flight is not None and len(others) >= in_flight:
            raise OverQuota(f"{len(others)} uploads in flight, the quota uploads_in_flight")
        self.claimed.add(upload_key)
        if identity in self.identity and self.identity[identity] in self.rows:
            old = self.rows[self.identity[identity]]
            started = self._start(old, upload_key, new.reply_to, new.correlation_id, sections=None)
        else:
            source_id = uuid.uuid4()
            if identity:
                self.identity[identity] = source_id
            self.pending_since[source_id] = self.clock.now()
            self.rows[source_id] = SourceState(
                id=source_id, organization_id=organization_id, title=new.title,
                status="pending", status_reason=None, generation=1, chunk_count=None,
                updated_at=self.pending_since[source_id], reply_to=new.reply_to,
                correlation_id=new.correlation_id, upload_key=upload_key,
                media_type=new.media_type,
            )  # fmt: skip
            started = Accepted(source_id, 1, None)
        return self._opened(True, started, self.rows[started.source_id])

    async def open_reingest(
        self, organization_id: UUID | None, key: str, source_id: UUID, *, restart: bool,
        reply_to: str | None, correlation_id: str | None,
    ) -> Opened:  # fmt: skip
        self.calls.append("open_reingest")
        claimed = key not in self.claimed
        self.claimed.add(key)
        started = None
        old = self.rows.get(source_id)
        if claimed and restart and old is not None and old.sections is not None:
            started = self._start(old, key, reply_to, correlation_id, sections=old.sections)
        return self._opened(claimed, started, self.rows.get(source_id))

    async def source(self, organization_id: UUID | None, source_id: UUID) -> SourceState | None:
        self.calls.append("source")
        return self.rows.get(source_id)

    async def record_text(
        self, source: SourceState, sections: list[Section], chunk_counts: dict[str, int],
        size_bytes: int | None, *, stored_chunks: int | None = None,
    ) -> SourceState | None:  # fmt: skip
        self.calls.append("record_text")
        for model, count in chunk_counts.items():
            held = sum(counts.get(model, 0) for (other, _), counts in self.expected.items()
                       if other != source.id and self.rows[other].status != "failed")  # fmt: skip
            if stored_chunks is not None and held + count > stored_chunks:
                raise OverQuota(f"{held} chunks held, the quota stored_chunks")
        current = self.rows.get(source.id)
        if current is not None and current.generation == source.generation:
            self.rows[source.id] = replace(current, sections=sections)
            self.expected[source.id, source.generation] = dict(chunk_counts)
        return self.rows.get(source.id)

    async def expect_chunks(
        self, source: SourceState, chunk_counts: dict[str, int]
    ) -> SourceState | None:
        self.calls.append("expect_chunks")
        self.expected.setdefault((source.id, source.generation), {}).update(chunk_counts)
        return self.rows.get(source.id)

    async def fail(self, source: SourceState, reason: str) -> SourceState | None:
        self.calls.append("fail")
        current = self.rows.get(source.id)
        pending = current is not None and current.status == "pending"
        if current is not None and pending and current.generation == source.generation:
            self.rows[source.id] = replace(current, status="failed", status_reason=reason)
        return self.rows.get(source.id)


class Objects:
    """Objects by path; refuses paths outside ``/docs``."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.files = files or {}
        self.down = False
        self.reads = 0

    def check(self, address: ObjectAddress, organization_id: UUID | None) -> None:
        if not address.key.startswith("/docs/"):
            raise ObjectError("this service does not read that path")

    async def read(self, address: ObjectAddress, organization_id: UUID | None) -> bytes:
        self.reads += 1
        if self.down:
            raise ObjectUnavailable("the object store did not answer")
        if address.key not in self.files:
            raise ObjectError("no such object")
        return self.files[address.key]


class Words:
    """Cuts a document into one section, and a chunk per word per model; ``during`` runs while
    it cuts (another upload, an admin's delete)."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes | None, list[Section] | None, list[str]]] = []
        self.during: list[object] = []

    async def cut(
        self, *, title: str, models: dict[str, ModelWindow], media_type: str = "",
        document: bytes | None = None, sections: list[Section] | None = None,
        limits: Limits | None = None,
    ) -> Cut:  # fmt: skip
        self.calls.append((document, sections, sorted(models)))
        for step in self.during:
            await step()  # type: ignore[operator]
        if sections is None:
            text = (document or b"").decode()
            if not text.strip():
                raise ExtractionError("the document has no text")
            sections = [Section((title,), [text])]
        words = [w for s in sections for p in s.paragraphs for w in p.split()]
        chunks = [Chunk(i, title, w, 3) for i, w in enumerate(words)]
        if limits is not None and len(chunks) > limits.max_chunks:
            raise ExtractionError(f"the document makes more than {limits.max_chunks} passages")
        return Cut(sections, {model: chunks for model in models})


WINDOW = ModelWindow(Path("/nowhere"), ChunkSettings())


class Chunks:
    """The chunk store of the embedding group on :class:`Sources`' tables: a batch of the
    current generation counts its chunks under its model, and the batch that reaches the count
    the upload expected makes the source ready (the uploader is told). Another generation's
    batch is stale, stores nothing."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.stored: dict[tuple[UUID, int, str], set[int]] = {}

    async def store_batch(
        self, organization_id: UUID | None, source_id: UUID, model: str, generation: int,
        chunks: Sequence[Chunk], vectors: Sequence[Sequence[float]],
    ) -> BatchResult:  # fmt: skip
        row = self.sources.rows.get(source_id)
        if row is None or row.generation != generation or row.status != "pending":
            return BatchResult(inserted=0, model_ready=False, source=None, stale=True)
        kept = self.stored.setdefault((source_id, generation, model), set())
        before = len(kept)
        kept.update(chunk.ordinal for chunk in chunks)
        expected = self.sources.expected.get((source_id, generation), {}).get(model)
        ready = expected is not None and len(kept) >= expected
        if ready:
            self.sources.rows[source_id] = replace(row, status="ready", chunk_count=len(kept))
        source = self.sources.rows[source_id] if ready else None
        return BatchResult(inserted=len(kept) - before, model_ready=ready, source=source)

    async def fail(
        self, organization_id: UUID | None, source_id: UUID, generation: int, reason: str
    ) -> SourceState | None:
        row = self.sources.rows.get(source_id)
        if row is not None and row.generation == generation and row.status == "pending":
            self.sources.rows[source_id] = replace(row, status="failed", status_reason=reason)
        return self.sources.rows.get(source_id)


class Lengths:
    """An encoder of ``model``: a vector per text, its length and its first letter's code."""

    dimensions = 2

    def __init__(self, model: str) -> None:
        self.model = model

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        return [[float(len(t)), float(ord(t[0]))] for t in texts]


HOUR, DAY = timedelta(hours=1), timedelta(days=1)


class SweepTables:
    """The sweep's tables (consumers/knowledge/sweep/app.py's ``SweepStore``, its own session)
    on :class:`Sources`' rows and :class:`Chunks`' stored ordinals, on the sources' clock, with
    the rules of the database's functions: nothing younger than an hour is failed (a claim,
    than a day), the longest pending first, a bounded batch a call; the reason says since when
    and how many of the chunks were stored. ``claims`` and ``journal``: when each
    processed-message claim was made and each start-journal row last started; ``indexed``: the
    tenants (organization, model) with an index of their own. Not kept: a model's state pending
    alone (a switch's target), which the upload and embed fakes have none of."""

    def __init__(self, sources: Sources, chunks: Chunks | None = None) -> None:
        self.sources = sources
        self.chunks = chunks
        self.clock = sources.clock
        self.claims: list[datetime] = []
        self.journal: list[datetime] = []
        self.indexed: set[tuple[UUID | None, str]] = set()
        self.sessions = 0
        self.calls: list[tuple[str, int]] = []
        """``(statement, batch)`` of each call, in order."""

    @asynccontextmanager
    async def session(self) -> AsyncIterator[SweepTables]:
        self.sessions += 1
        yield self

    async def fail_stale(self, older_than: timedelta, batch: int) -> list[Swept]:
        if batch <= 0:
            raise ValueError(f"sweep batch must be positive, not {batch}")
        self.calls.append(("fail_stale", batch))
        cutoff = self.clock.now() - max(older_than, HOUR)
        rows = self.sources.rows
        stale = sorted(
            (since, source_id)
            for source_id, since in self.sources.pending_since.items()
            if rows[source_id].status == "pending" and since < cutoff
        )[:batch]
        swept = []
        for since, source_id in stale:
            row = rows[source_id]
            model, reason = self._reason(row, since)
            rows[source_id] = replace(row, status="failed", status_reason=reason)
            swept.append(
                Swept(
                    row.organization_id,
                    source_id,
                    model,
                    row.title,
                    reason,
                    row.reply_to,
                    row.correlation_id,
                )
            )
        return swept

    def _reason(self, row: SourceState, since: datetime) -> tuple[str | None, str]:
        """The model the reason names (the first by name), and the reason, as the SQL words it."""
        at = f"pending for more than an hour (since {since:%Y-%m-%dT%H:%M:%SZ})"
        expected = self.sources.expected.get((row.id, row.generation), {})
        if not expected:
            return None, f"{at} before its text was chunked"
        model = min(expected)
        stored = self.chunks.stored if self.chunks is not None else {}
        count = len(stored.get((row.id, row.generation, model), ()))
        return model, f"{at}: {count} of {expected[model]} chunks stored under {model}"

    async def source_counts(self) -> SourceCounts:
        self.calls.append(("source_counts", 0))
        counts = {status: 0 for status in ("pending", "ready", "failed")}
        for row in self.sources.rows.values():
            counts[row.status] += 1
        since = self.sources.pending_since
        waiting = [since[i] for i, row in self.sources.rows.items() if row.status == "pending"]
        oldest = (self.clock.now() - min(waiting)).total_seconds() if waiting else None
        return SourceCounts(counts, oldest)

    async def unindexed_tenants(self, min_chunks: int) -> int:
        if min_chunks < 100:
            raise ValueError(f"the index threshold must be at least 100 chunks, not {min_chunks}")
        self.calls.append(("unindexed_tenants", min_chunks))
        sizes: dict[tuple[UUID | None, str], int] = {}
        for (source_id, generation), counts in self.sources.expected.items():
            row = self.sources.rows[source_id]
            if row.generation == generation and row.status != "failed":
                for model, count in counts.items():
                    tenant = (row.organization_id, model)
                    sizes[tenant] = sizes.get(tenant, 0) + count
        return sum(1 for t, n in sizes.items() if n >= min_chunks and t not in self.indexed)

    def _prune(self, rows: list[datetime], older_than: timedelta, batch: int) -> int:
        if batch <= 0 or older_than <= timedelta(0):
            raise ValueError(f"prune batch and retention must be positive: {batch}, {older_than}")
        cutoff = self.clock.now() - older_than
        gone = [i for i, at in enumerate(rows) if at < cutoff][:batch]
        for i in reversed(gone):
            del rows[i]
        return len(gone)

    async def prune_ledger(self, older_than: timedelta, batch: int) -> int:
        self.calls.append(("prune_ledger", batch))
        return self._prune(self.claims, max(older_than, DAY), batch)

    async def prune_journal(self, older_than: timedelta, batch: int) -> int:
        self.calls.append(("prune_journal", batch))
        return self._prune(self.journal, older_than, batch)
