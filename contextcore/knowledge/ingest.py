"""One upload, from its message to the embedding batches: the upload consumer's work, without Kafka.

:meth:`Ingestion.prepare` is idempotent per upload key and resumable at every step, because a
record is redelivered after a crash at any point:

1. In one transaction, the ledger claim of the upload key and the source row (created, or its
   next generation started: ``pending``). A key already claimed resumes the generation it
   started, if that is still the source's current one; when it has finished, the source's
   status is the answer; when a later upload replaced it, ``superseded`` is.
2. Read the object, extract the text, chunk it per target model (the live model, and the model
   a switch is moving to). A reason to fail (an unreadable type, empty text, a corrupt or
   encrypted PDF, a refused object) fails the generation with that reason.
3. In a second transaction, the sections and the chunk count per model.
4. The caller publishes :attr:`Prepared.batches` (again, on a redelivery: the embedding group
   stores a chunk once) and tells the uploader the status.

One document identity has one current generation and one uploader's address, so a generation
replaced while still pending would leave its uploader waiting for ever. Its uploader is told
``superseded`` twice over: by the upload that replaced it, through the ``replaced`` callback,
as soon as the accept commits (before anything can fail or be retried: a redelivered record no
longer learns the address, which the row has forgotten); and by its own handling, when that
finds its generation replaced at any later step (:attr:`Prepared.superseded`).

Extraction and chunking run in a worker process (:class:`~.sandbox.TextSandbox`), bounded by
:class:`~.extract.Limits` and the sandbox's memory, CPU, wall-time and output limits; passing one
fails the generation with that reason, like any other reason a document has no text.

:class:`Ingestion` reaches the world through three ports: :class:`KnowledgeRepository` (the
knowledge tables; :class:`~.store.PostgresKnowledgeRepository`), :class:`ObjectStore` (uploaded
objects; :class:`~.objects.ObjectReader`) and :class:`TextCutter` (the sandbox). Its own logic,
the order of the steps and every answer of a redelivery, has unit tests on in-memory ones
(tests/unit/test_ingestion.py).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol
from uuid import UUID

from contextcore.knowledge.addresses import (
    ObjectAddress,
    ObjectError,
    ObjectUnavailable,
    parse,
)
from contextcore.knowledge.chunk import TOO_MANY_PASSAGES, Chunk, Cut, ModelWindow
from contextcore.knowledge.extract import ExtractionError, Limits, Section
from contextcore.knowledge.state import DELETED, Accepted, SourceState, Superseded
from contextcore.quotas import NO_QUOTAS, Quotas
from schemas.errors import ContextcoreError

CONSUMER = "upload"
"""The consumer whose ledger claims an upload key (the store claims it under this name)."""


class UploadRefused(ContextcoreError):
    """The database refuses to open this upload for good (a value it cannot hold, a rule it
    breaks): refused at once, as an invalid upload is, since the same upload again is refused
    again. Nothing was stored."""


class NoSuchOrganization(UploadRefused):
    """The upload names an organization the database does not hold (no retry creates one)."""


class OverQuota(UploadRefused):
    """A quota of the organization (contextcore/quotas.py) refuses this; the message names it.
    Nothing of it was stored: refused at once, or, past the accept, the source fails with it."""


@dataclass(frozen=True)
class Upload:
    organization_id: UUID | None
    title: str
    media_type: str
    upload_key: str
    uri: str | None = None
    object: str | None = None
    text: str | None = None
    base64: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None


@dataclass(frozen=True)
class Reingest:
    organization_id: UUID | None
    source_id: UUID
    key: str
    models: tuple[str, ...] | None = None
    reply_to: str | None = None
    correlation_id: str | None = None


@dataclass(frozen=True)
class NewSource:
    """A document to create, or to start the next generation of: ``uri`` or ``object_key`` is
    its identity in its scope (neither, for an inline document: each is a source of its own)."""

    kind: str
    title: str
    uri: str | None
    object_key: str | None
    media_type: str
    reply_to: str | None
    correlation_id: str | None


@dataclass(frozen=True)
class Opened:
    """What the first transaction of an upload or a re-ingest found."""

    claimed: bool
    """The call's key was new: this is its first handling, not a redelivery."""
    started: Accepted | None
    """The generation this call started; ``None`` on a redelivery, for a switch, and for a
    re-ingest of a source with no stored text."""
    source: SourceState | None
    """The source now (``None``: there is none, or it was deleted)."""
    live_model: str
    next_model: str | None
    """The model a switch is moving the scope to, if one is."""
    quotas: Quotas = NO_QUOTAS
    """The organization's quotas in force (none for the platform's documents)."""


class KnowledgeRepository(Protocol):
    """The knowledge tables as ingestion uses them. Each method is one transaction in the
    scope of ``organization_id`` (``None``: the platform's), and returns the source as that
    transaction left it (``None``: deleted)."""

    async def open_upload(
        self, organization_id: UUID | None, upload_key: str, new: NewSource
    ) -> Opened:
        """Claim ``upload_key``; when it is new, create the source with this identity or start
        its next generation. Then the source (by identity, when the key was claimed before) and
        the scope's models.

        Raises:
            UploadRefused: the database refuses the upload for good (nothing stored);
                ``NoSuchOrganization`` when ``organization_id`` names no organization.
        """
        ...

    async def open_reingest(
        self,
        organization_id: UUID | None,
        key: str,
        source_id: UUID,
        *,
        restart: bool,
        reply_to: str | None,
        correlation_id: str | None,
    ) -> Opened:
        """Claim ``key``; when it is new and ``restart``, start the source's next generation
        from its stored text. Then the source and the scope's models."""
        ...

    async def source(self, organization_id: UUID | None, source_id: UUID) -> SourceState | None: ...

    async def record_text(
        self,
        source: SourceState,
        sections: list[Section],
        chunk_counts: dict[str, int],
        size_bytes: int | None,
        *,
        stored_chunks: int | None = None,
    ) -> SourceState | None:
        """Keep the generation's extracted text and how many chunks it has per model.

        Raises:
            OverQuota: the organization's other sources hold so many chunks that these would
                pass ``stored_chunks`` (nothing was written).
        """
        ...

    async def expect_chunks(
        self, source: SourceState, chunk_counts: dict[str, int]
    ) -> SourceState | None:
        """The generation has this many chunks per model (a ready model is left as it is)."""
        ...

    async def fail(self, source: SourceState, reason: str) -> SourceState | None:
        """Fail the generation with ``reason``, unless it is no longer pending."""
        ...


class ObjectStore(Protocol):
    """Where uploaded objects are read: refused at once, or read under the service's bounds."""

    def check(self, address: ObjectAddress, organization_id: UUID | None) -> None:
        """Raises :class:`ObjectError` for an address this service will not read for this
        uploader, before anything is stored."""
        ...

    async def read(self, address: ObjectAddress, organization_id: UUID | None) -> bytes:
        """Raises :class:`ObjectError` (for good) or :class:`ObjectUnavailable` (try again)."""
        ...


class TextCutter(Protocol):
    """Extracts a document's sections and cuts them into chunks per model, bounded."""

    async def cut(
        self,
        *,
        title: str,
        models: dict[str, ModelWindow],
        media_type: str = "",
        document: bytes | None = None,
        sections: list[Section] | None = None,
        limits: Limits | None = None,
    ) -> Cut:
        """Raises :class:`~.extract.ExtractionError`: why there is no text."""
        ...


_NO_TEXT = "the source has no stored text (its extraction failed): upload the document again"


@dataclass(frozen=True)
class Batch:
    organization_id: UUID | None
    source_id: UUID
    generation: int
    model: str
    chunks: list[Chunk]


@dataclass(frozen=True)
class Prepared:
    source: SourceState
    batches: list[Batch]
    superseded: Superseded | None = None
    """This upload's generation was replaced by a later one: the answer is ``superseded``,
    never :attr:`source`'s status (which belongs to the later upload)."""


Replaced = Callable[[Superseded], Awaitable[None]]
"""Tells the uploader of a replaced pending generation (the upload consumer publishes
``superseded`` on its address)."""


async def _ignore(replaced: Superseded) -> None:
    """The default :data:`Replaced`: nobody to tell."""


class Ingestion:
    def __init__(
        self,
        repository: KnowledgeRepository,
        reader: ObjectStore,
        sandbox: TextCutter,
        models: Callable[[str], ModelWindow | None],
        *,
        limits: Limits | None = None,
        batch_size: int = 32,
    ) -> None:
        """``models`` gives a model's tokenizer and window, or ``None`` for a model this
        process cannot cut for (the source then fails with that reason)."""
        self.repository = repository
        self.reader = reader
        self.sandbox = sandbox
        self.models = models
        self.limits = limits or Limits()
        self.batch_size = batch_size

    async def prepare(
        self, upload: Upload, *, last_attempt: bool = False, replaced: Replaced = _ignore
    ) -> Prepared:
        """Every failure to read the document is a failed source, but two (below).

        ``replaced`` is awaited once the accept has committed, when it replaced a generation
        that was still pending (see the module docstring).

        Raises:
            ObjectError: the address is refused (malformed, a bucket or a path this service
                does not read): nothing was stored.
            UploadRefused: the database refuses the upload for good (``NoSuchOrganization``:
                it names no organization): nothing was stored.
            ObjectUnavailable: the object store did not answer (the upload is to be retried);
                on the ``last_attempt`` the source fails with that reason instead.
        """
        address = parse(upload.object) if upload.object is not None else None
        if address is not None:
            self.reader.check(address, upload.organization_id)
        opened = await self.repository.open_upload(
            upload.organization_id, upload.upload_key, _new_source(upload, address)
        )
        if opened.started is not None and opened.started.replaced is not None:
            await replaced(opened.started.replaced)
        state = opened.source
        if state is None:  # handled before, and its document deleted since
            return Prepared(_deleted(upload.title), [])
        if state.upload_key != upload.upload_key:  # a redelivery, after a later upload
            return Prepared(state, [], superseded=Superseded(state.id, state.generation))
        if state.status != "pending":
            return Prepared(state, [])
        live, switching = opened.live_model, opened.next_model
        targets = [live] if switching is None else [live, switching]
        quotas = opened.quotas
        quota, size_bytes = quotas.chunks_per_document, None
        try:
            if state.sections is None:
                data = await self._content(upload, address)
                size_bytes = len(data)
                cut = await self._cut(
                    state.title, targets, document=data, media_type=upload.media_type, quota=quota
                )
            else:
                cut = await self._cut(state.title, targets, sections=state.sections, quota=quota)
        except (ExtractionError, ObjectError) as error:
            return await self._fail(state, str(error))
        except ObjectUnavailable as error:
            if not last_attempt:
                raise
            return await self._fail(state, f"{error} (after the last attempt)")
        return await self._record(state, cut, size_bytes, quotas.stored_chunks)

    async def _record(
        self, state: SourceState, cut: Cut, size_bytes: int | None, stored_chunks: int | None
    ) -> Prepared:
        """The cut text recorded (unless an earlier handling of this upload did), then its
        batches; a source an admin deleted meanwhile, or one superseded, yields none."""
        if state.sections is None:
            counts = {model: len(chunks) for model, chunks in cut.chunks.items()}
            try:
                current = await self.repository.record_text(
                    state, cut.sections, counts, size_bytes, stored_chunks=stored_chunks
                )
            except OverQuota as error:
                return await self._fail(state, str(error))
        else:  # recorded by an earlier handling of this upload
            current = await self.repository.source(state.organization_id, state.id)
        if current is None:  # an admin deleted it meanwhile
            return Prepared(_deleted(state.title, state), [])
        return _unless_superseded(state, current, self._batches(state, cut.chunks))

    async def reingest(self, command: Reingest, *, replaced: Replaced = _ignore) -> Prepared | str:
        """A stored source again, from its stored text: a retry (a new generation, every target
        model) or a switch's first step (the current generation, ``command.models`` only).
        Returns why it cannot be done instead (no such source, no stored text). A retry that
        replaces a pending generation tells its uploader through ``replaced``, as an upload
        does."""
        opened = await self.repository.open_reingest(
            command.organization_id,
            command.key,
            command.source_id,
            restart=command.models is None,
            reply_to=command.reply_to,
            correlation_id=command.correlation_id,
        )
        if opened.started is not None and opened.started.replaced is not None:
            await replaced(opened.started.replaced)
        state, active, switching = opened.source, opened.live_model, opened.next_model
        if opened.claimed and command.models is None and opened.started is None:
            return "no such source" if state is None else _NO_TEXT  # nothing to restart from
        if state is None:
            return "no such source"
        if state.sections is None:
            return _NO_TEXT
        if command.models is None:
            if state.upload_key != command.key:  # a redelivery, after a later upload or retry
                return Prepared(state, [], superseded=Superseded(state.id, state.generation))
            if state.status != "pending":
                return Prepared(state, [])  # done: the answer is its status
            targets = [active] if switching is None else [active, switching]
        else:
            targets = list(command.models)
        try:
            cut = await self._cut(state.title, targets, sections=state.sections)
        except ExtractionError as error:
            if command.models is None:  # the retry's generation fails now, not at the sweep
                return await self._fail(state, str(error))
            return str(error)  # a switch's chunks: the source stays as it is
        counts = {model: len(chunks) for model, chunks in cut.chunks.items()}
        current = await self.repository.expect_chunks(state, counts)
        if current is None:
            return "no such source"
        if command.models is not None:
            return Prepared(state, self._batches(state, cut.chunks))
        return _unless_superseded(state, current, self._batches(state, cut.chunks))

    async def give_up(self, prepared: Prepared, reason: str) -> Prepared:
        """Fail the generation ``prepared`` was about (unless a later one replaced it, or it is
        no longer pending): its batches cannot be stored, and ``reason`` says why to a person.
        Nothing of it is published; the answer is the source as it is now."""
        state = prepared.source
        current = await self.repository.fail(state, reason)
        if current is None:  # an admin deleted it meanwhile
            return Prepared(_deleted(state.title, state), [])
        return _unless_superseded(state, current, [])

    def _batches(self, state: SourceState, chunked: dict[str, list[Chunk]]) -> list[Batch]:
        size = self.batch_size
        return [
            Batch(state.organization_id, state.id, state.generation, model, chunks[i : i + size])
            for model, chunks in chunked.items()
            for i in range(0, len(chunks), size)
        ]

    async def _content(self, upload: Upload, address: ObjectAddress | None) -> bytes:
        if address is not None:
            return await self.reader.read(address, upload.organization_id)
        if upload.text is not None:
            return upload.text.encode("utf-8", "surrogatepass")
        try:
            return base64.b64decode(upload.base64 or "", validate=True)
        except (binascii.Error, ValueError) as error:
            raise ExtractionError("the inline content is not valid base64") from error

    async def _cut(
        self,
        title: str,
        models: list[str],
        *,
        document: bytes | None = None,
        media_type: str = "",
        sections: list[Section] | None = None,
        quota: int | None = None,
    ) -> Cut:
        """The sections and chunks, at most ``self.limits.max_chunks`` per model, or fewer
        when the organization's quota chunks_per_document (``quota``) is lower: the reason
        then names the quota."""
        windows = {}
        for model in models:
            window = self.models(model)
            if window is None:
                raise ExtractionError(f"this service cannot cut text for the model {model!r}")
            windows[model] = window
        limits = self.limits
        if quota is not None and quota < limits.max_chunks:
            limits = replace(limits, max_chunks=quota)
        try:
            return await self.sandbox.cut(
                title=title,
                models=windows,
                media_type=media_type,
                document=document,
                sections=sections,
                limits=limits,
            )
        except ExtractionError as error:
            if limits is self.limits or not str(error).startswith(TOO_MANY_PASSAGES):
                raise
            raise ExtractionError(
                f"{TOO_MANY_PASSAGES} {quota:,} passages, the organization's quota "
                "chunks_per_document: split it, or ask the operator to raise the quota"
            ) from error

    async def _fail(self, state: SourceState, reason: str) -> Prepared:
        return await self.give_up(Prepared(state, []), reason)


def _new_source(upload: Upload, address: ObjectAddress | None) -> NewSource:
    """The source row an upload opens: inline, or the object it names (an ``s3://`` object
    by its key, a ``file://`` one by its URI)."""
    uri, object_key, kind = upload.uri, None, "inline"
    if address is not None:
        kind = address.scheme
        if address.scheme == "s3":
            object_key = address.object_key
        else:
            uri = upload.object
    return NewSource(
        kind=kind,
        title=upload.title,
        uri=uri,
        object_key=object_key,
        media_type=upload.media_type,
        reply_to=upload.reply_to,
        correlation_id=upload.correlation_id,
    )


def _deleted(title: str, state: SourceState | None = None) -> SourceState:
    """What an upload hears when its document was deleted before it was ready."""
    if state is not None:
        return replace(state, status="failed", status_reason=DELETED)
    return SourceState(
        id=UUID(int=0),
        organization_id=None,
        title=title,
        status="failed",
        status_reason=DELETED,
        generation=1,
        chunk_count=None,
        updated_at=datetime.now(UTC),
    )


def _unless_superseded(
    started: SourceState, current: SourceState, batches: list[Batch]
) -> Prepared:
    """The work on generation ``started`` is done; ``current`` is the source now. A later
    upload may have replaced that generation meanwhile (its steps then changed nothing): the
    answer is ``superseded``, and its batches, which the embedding group would find stale, are
    not published."""
    if current.generation != started.generation:
        superseded = Superseded(current.id, current.generation, started.generation)
        return Prepared(current, [], superseded=superseded)
    return Prepared(current, batches)
