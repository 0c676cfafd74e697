"""``KnowledgeClient``: upload a document and wait until its source is ``ready`` (or why not).

One upload gets several status replies on the client's reply topic (``pending``, then ``ready``
or ``failed``; ``rejected`` for an invalid upload; ``superseded`` when a later upload of the same
document replaced it first), all with its correlation id; duplicates may arrive (delivery is at
least once), and ``ready`` may overtake ``pending``: both are harmless.
:meth:`KnowledgeClient.upload` returns the first final status.
Correlation ids are the client's own, new and unguessable for every call
(:func:`~producers.client.new_correlation_id`): a status nobody waits for is ignored, and one
meant for an earlier upload can never answer a later one.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from pathlib import Path
from typing import Unpack
from uuid import UUID

from pydantic import ValidationError

from broker.settings import KafkaSettings, TopicSettings
from producers.client import ChannelOptions, ReplyChannel, channel_options, new_correlation_id
from producers.staging import INLINE_BYTES, Stage, object_name
from schemas.errors import ClientClosed, ClientError, ReplyTimeout, RequestRefused
from schemas.upload import InlineContent, ReingestRequestV1, UploadRequestV1, UploadStatusV1

log = logging.getLogger("contextcore.client")

FINAL = frozenset({"ready", "failed", "rejected", "superseded"})
MEDIA_TYPES = {
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}


class UploadFailed(RequestRefused):
    """The upload was rejected, or its source failed (``status`` holds the reply)."""

    def __init__(self, status: UploadStatusV1) -> None:
        self.status = status
        super().__init__(status.status, status.reason or status.status, status.details)


class DocumentTooLarge(ClientError, ValueError):
    """The file does not fit one record: upload it through a stage."""


class UploadSuperseded(UploadFailed):
    """A later upload (or retry) of the same document replaced this one before it was ready:
    the source now follows that one (``status.reason`` names its generation)."""


def _raise_unless_ready(status: UploadStatusV1) -> UploadStatusV1:
    if status.status == "superseded":
        raise UploadSuperseded(status)
    if status.status != "ready":
        raise UploadFailed(status)
    return status


class KnowledgeClient(ReplyChannel):
    def __init__(self, *, upload_topic: str, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(**options)
        self.upload_topic = upload_topic
        self._statuses: dict[str, asyncio.Queue[UploadStatusV1 | None]] = {}
        """Each waiting upload's statuses as they come; ``None``: the client closed."""

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, topics: TopicSettings) -> KnowledgeClient:
        return cls(upload_topic=topics.upload, **channel_options(kafka, topics))

    def _cancel_waiters(self) -> None:
        for queue in self._statuses.values():
            queue.put_nowait(None)

    def _on_reply(self, value: bytes, offset: int) -> None:
        try:
            status = UploadStatusV1.model_validate_json(value)
        except ValidationError:
            log.warning("ignoring a malformed upload status at offset %d", offset)
            return
        queue = self._statuses.get(status.correlation_id)
        if queue is not None:
            queue.put_nowait(status)

    async def upload(
        self,
        *,
        organization_id: UUID | None,
        title: str,
        media_type: str,
        uri: str | None = None,
        content: bytes | str | None = None,
        object: str | None = None,
        idempotency_key: str | None = None,
        timeout: float = 300.0,
    ) -> UploadStatusV1:
        """Upload one document (inline ``content`` with a ``uri``, or an ``object`` address) to
        an organization, or to the platform when ``organization_id`` is ``None``; the ``ready``
        status once every chunk is stored. The correlation id is a new one of this client's.

        Raises:
            UploadSuperseded: a later upload of the same document replaced this one first.
            UploadFailed: the upload was rejected or its source failed (with the reason).
            ReplyTimeout: no final status within ``timeout`` seconds.
            PublishFailed: the broker did not take the upload.
        """
        inline = None
        if isinstance(content, str):
            inline = InlineContent(text=content)
        elif content is not None:
            inline = InlineContent(base64=base64.b64encode(content).decode())
        message = UploadRequestV1(
            correlation_id=new_correlation_id(),
            reply_to=self.reply_topic,
            scope="platform" if organization_id is None else "organization",
            organization_id=organization_id,
            title=title,
            media_type=media_type,
            idempotency_key=idempotency_key or uuid.uuid4().hex,
            uri=uri,
            object=object,
            content=inline,
        )
        value = message.model_dump_json().encode()
        return await self._await_final(message.correlation_id, value, timeout, organization_id)

    async def reingest(
        self,
        *,
        organization_id: UUID | None,
        source_id: UUID,
        models: list[str] | None = None,
        wait: bool = False,
        timeout: float = 300.0,
    ) -> UploadStatusV1 | None:
        """Ask the upload consumer to ingest a stored source again (see
        :class:`~schemas.upload.ReingestRequestV1`); with ``wait``, its final status.

        Raises:
            UploadSuperseded: (``wait``) a later upload of the source replaced this one first.
            UploadFailed: (``wait``) the re-ingestion was refused or the source failed.
            ReplyTimeout: (``wait``) no final status within ``timeout`` seconds.
            PublishFailed: the broker did not take the request.
        """
        correlation_id = new_correlation_id()
        message = ReingestRequestV1(
            action="reingest",
            scope="platform" if organization_id is None else "organization",
            organization_id=organization_id,
            source_id=source_id,
            models=models,
            idempotency_key=uuid.uuid4().hex,
            reply_to=self.reply_topic if wait else None,
            correlation_id=correlation_id if wait else None,
        )
        if not wait:
            value = message.model_dump_json().encode()
            await self._send(self.upload_topic, value, b"", organization_id)
            return None
        value = message.model_dump_json().encode()
        return await self._await_final(correlation_id, value, timeout, organization_id)

    async def _await_final(
        self, key: str, value: bytes, timeout: float, organization_id: UUID | None
    ) -> UploadStatusV1:
        queue: asyncio.Queue[UploadStatusV1 | None] = asyncio.Queue()
        self._statuses[key] = queue
        try:
            await self._send(self.upload_topic, value, key.encode(), organization_id)
            async with asyncio.timeout(timeout):
                while True:
                    status = await queue.get()
                    if status is None:
                        raise ClientClosed(f"the client closed while upload {key} waited")
                    if status.status in FINAL:
                        break
        except TimeoutError:
            raise ReplyTimeout(f"upload {key} was not final within {timeout:g} s") from None
        finally:
            self._statuses.pop(key, None)
        self.session.note(status.position)
        return _raise_unless_ready(status)

    async def upload_file(
        self,
        path: Path,
        *,
        organization_id: UUID | None,
        title: str | None = None,
        media_type: str | None = None,
        uri: str | None = None,
        stage: Stage | None = None,
        timeout: float = 300.0,
    ) -> UploadStatusV1:
        """Upload a local file: inline when it fits one record (:data:`INLINE_BYTES`), else by
        reference through ``stage`` (see :mod:`producers.staging`; always, when given). A staged
        document's identity is its object, named after ``uri`` (default: the file's own URI), so
        a new version of the same file updates the same source.

        Raises:
            DocumentTooLarge: the file does not fit one record and no ``stage`` was given.
            OSError: the file cannot be read, or staged.
            UploadSuperseded, UploadFailed, ReplyTimeout, PublishFailed: as :meth:`upload`.
        """
        kind = media_type or MEDIA_TYPES.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"cannot tell the media type of {path.name}: give media_type")
        resolved = await asyncio.to_thread(path.resolve)
        identity = uri or resolved.as_uri()
        if stage is not None:
            name = object_name(organization_id, identity, path.suffix)
            address = await stage.put(path, name)
            return await self.upload(
                organization_id=organization_id,
                title=title or path.stem,
                media_type=kind,
                object=address,
                timeout=timeout,
            )
        size = (await asyncio.to_thread(path.stat)).st_size
        if size > INLINE_BYTES:
            raise DocumentTooLarge(
                f"{path.name} is {size} bytes; an inline upload carries {INLINE_BYTES} at most:"
                " stage it where the upload consumer reads (a file root or an S3 bucket)"
            )
        data = await asyncio.to_thread(path.read_bytes)
        return await self.upload(
            organization_id=organization_id,
            title=title or path.stem,
            media_type=kind,
            uri=identity,
            content=data,  # base64 on the wire: the consumer decodes text as UTF-8 itself
            timeout=timeout,
        )
