"""Where a document too large for one Kafka record waits for the upload consumer to read it.

An inline upload carries the document in its record, base64: at most :data:`INLINE_BYTES`
(the record's 900,000 characters). A larger one, up to the consumer's document limit (20 MB by
default), goes *by reference*: the client puts the file where the upload consumer reads objects
and the upload names it (``object``):

* :class:`FileStage`: a directory the consumer reads as its upload root
  (``CONTEXTCORE_UPLOAD_FILE_ROOT``), shared with the client (a volume); the file is written
  beside its final name and renamed into place, so the consumer never reads half of it, in the
  organization's folder (which the consumer requires), readable by the user and its group only
  (the consumer runs as the client's user or in its group).
* :class:`S3Stage`: a bucket the consumer reads (``CONTEXTCORE_UPLOAD_S3_BUCKETS``), under the
  organization's prefix (``<organization id>/``, ``platform/``), which the consumer requires.

A document's object is named by its identity (the uri the caller gives, by default the file's
own), hashed, not by its content: a new version of the same document replaces the object and so
updates the same source, as a second inline upload of the same uri does.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from uuid import UUID

from schemas.upload import MAX_INLINE_CHARS

INLINE_BYTES = MAX_INLINE_CHARS // 4 * 3
"""The largest file an inline upload carries (its base64 fills the record's 900,000 chars)."""


def object_name(organization_id: UUID | None, identity: str, suffix: str) -> str:
    """``<organization id or platform>/<hash of the identity><suffix>``."""
    scope = "platform" if organization_id is None else str(organization_id)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return f"{scope}/{digest}{suffix.lower()[:16]}"


class Stage(Protocol):
    async def put(self, path: Path, name: str) -> str:
        """Store the file at ``path`` under ``name`` (see :func:`object_name`); the object
        address the upload consumer reads it from.

        Raises:
            OSError: the file could not be read or stored.
        """


@dataclass(frozen=True)
class FileStage:
    directory: Path
    """The upload consumer's file root, as this process sees it."""
    consumer_root: str | None = None
    """The same directory as the consumer sees it (another mount point); default: the same."""

    async def put(self, path: Path, name: str) -> str:
        await asyncio.to_thread(self._copy, path, name)
        root = (self.consumer_root or str(self.directory.resolve())).rstrip("/")
        return f"file://{root}/{name}"

    def _copy(self, path: Path, name: str) -> None:
        target = self.directory / name
        target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".upload-", delete=False) as out:
            try:
                with path.open("rb") as source:
                    shutil.copyfileobj(source, out, 1024 * 1024)
                out.flush()
                os.fsync(out.fileno())
            except BaseException:
                os.unlink(out.name)
                raise
        os.chmod(out.name, 0o640)  # the consumer shares this user or its group
        os.replace(out.name, target)


@dataclass(frozen=True)
class S3Stage:
    bucket: str
    endpoint_url: str | None = None
    """An S3-compatible server (default: AWS); credentials come from the environment."""
    region: str | None = None

    async def put(self, path: Path, name: str) -> str:
        await asyncio.to_thread(self._upload, path, name)
        return f"s3://{self.bucket}/{name}"

    def _upload(self, path: Path, name: str) -> None:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)
        try:
            client.upload_file(str(path), self.bucket, name)
        except (BotoCoreError, ClientError) as error:
            raise OSError(f"s3://{self.bucket}/{name}: {error}") from error
