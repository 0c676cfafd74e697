"""Reading an uploaded object: ``s3://bucket/key`` through the S3 API, ``file:///path`` from disk.

Both are tenant-checked before a byte is read, because the service's credentials can read more
than one tenant's objects:

* an S3 key must start with the uploader's organization id and a slash (``<org>/…``), or with
  ``platform/`` for the platform's documents, when ``tenant_prefixes`` is on (the default);
* a file must resolve (symlinks followed) inside ``file_root``; with no root, ``file://`` is
  refused.

Reads are bounded: an object larger than ``max_bytes`` is refused from its size, and a read
stops one byte past the bound (a size that lied). A missing object or a refused read is an
:class:`ObjectError` (the source fails with it); a network failure is :class:`ObjectUnavailable`
(the upload is retried).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from uuid import UUID

from contextcore.errors import ContextcoreError


class ObjectError(ContextcoreError):
    """The object cannot be read, for good: the message is the source's failure reason."""


class ObjectUnavailable(ContextcoreError):
    """The object store did not answer: try the upload again later."""


@dataclass(frozen=True)
class ObjectAddress:
    scheme: str
    bucket: str
    key: str

    @property
    def object_key(self) -> str:
        """The source identity of an S3 object: ``bucket/key``."""
        return f"{self.bucket}/{self.key}"


def parse(address: str) -> ObjectAddress:
    parts = urlsplit(address)
    if parts.scheme == "s3":
        key = unquote(parts.path.lstrip("/"))
        if not parts.netloc or not key:
            raise ObjectError(f"{address[:200]!r} is not s3://bucket/key")
        return ObjectAddress("s3", parts.netloc, key)
    if parts.scheme == "file":
        if parts.netloc not in {"", "localhost"}:
            raise ObjectError("a file:// address names no host")
        return ObjectAddress("file", "", unquote(parts.path))
    raise ObjectError(f"{parts.scheme!r} objects are not readable (s3:// or file://)")


class ObjectReader:
    def __init__(
        self,
        *,
        max_bytes: int,
        file_root: Path | None = None,
        s3_endpoint_url: str | None = None,
        s3_region: str | None = None,
        tenant_prefixes: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        self.max_bytes = max_bytes
        self.file_root = file_root.resolve() if file_root is not None else None
        self.s3_endpoint_url = s3_endpoint_url
        self.s3_region = s3_region
        self.tenant_prefixes = tenant_prefixes
        self.timeout_s = timeout_s
        self._s3: Any = None

    async def read(self, address: ObjectAddress, organization_id: UUID | None) -> bytes:
        if address.scheme == "file":
            return await asyncio.to_thread(self._read_file, address.key)
        self._check_prefix(address, organization_id)
        return await asyncio.to_thread(self._read_s3, address)

    def _check_prefix(self, address: ObjectAddress, organization_id: UUID | None) -> None:
        if not self.tenant_prefixes:
            return
        prefix = "platform/" if organization_id is None else f"{organization_id}/"
        if not address.key.startswith(prefix):
            raise ObjectError(f"the object key must start with {prefix!r} for this scope")

    def _read_file(self, path: str) -> bytes:
        if self.file_root is None:
            raise ObjectError("file:// uploads are off (no CONTEXTCORE_UPLOAD_FILE_ROOT)")
        resolved = Path(os.path.realpath(path))
        if not resolved.is_relative_to(self.file_root):
            raise ObjectError("the file is outside the upload root")
        try:
            with resolved.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size > self.max_bytes:
                    raise ObjectError(f"the file is {size} bytes, over the {self.max_bytes} limit")
                data = file.read(self.max_bytes + 1)
        except FileNotFoundError as error:
            raise ObjectError("the file does not exist") from error
        except IsADirectoryError as error:
            raise ObjectError("the address names a directory") from error
        except PermissionError as error:
            raise ObjectError("the file is not readable") from error
        if len(data) > self.max_bytes:
            raise ObjectError(f"the file is over the {self.max_bytes}-byte limit")
        return data

    def _client(self) -> Any:
        if self._s3 is None:
            import boto3
            from botocore.config import Config

            self._s3 = boto3.client(
                "s3",
                endpoint_url=self.s3_endpoint_url,
                region_name=self.s3_region,
                config=Config(
                    connect_timeout=self.timeout_s,
                    read_timeout=self.timeout_s,
                    retries={"max_attempts": 2},
                ),
            )
        return self._s3

    def _read_s3(self, address: ObjectAddress) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client().get_object(Bucket=address.bucket, Key=address.key)
            size = int(response.get("ContentLength") or 0)
            if size > self.max_bytes:
                response["Body"].close()
                raise ObjectError(f"the object is {size} bytes, over the {self.max_bytes} limit")
            data: bytes = response["Body"].read(self.max_bytes + 1)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code in {"NoSuchKey", "NoSuchBucket", "404", "AccessDenied", "403"}:
                raise ObjectError(f"the object cannot be read: {code}") from error
            raise ObjectUnavailable(f"the object store refused: {code or error}") from error
        except BotoCoreError as error:
            raise ObjectUnavailable(f"the object store did not answer: {error}") from error
        if len(data) > self.max_bytes:
            raise ObjectError(f"the object is over the {self.max_bytes}-byte limit")
        return data
