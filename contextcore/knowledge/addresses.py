"""Object addresses, parsed as the hostile input they are, and the two ways reading one fails:
pure, so the domain's ingestion knows them without the readers (objects.py: files, and S3
through boto3).

:func:`parse` refuses an address that is not plainly ``s3://bucket/key`` or ``file:///path``:
a NUL or control character once percent-decoded, an S3 "bucket" that is an ARN, a
``host:port`` or ``user:pw@host``, a query or a fragment.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from schemas.errors import ContextcoreError


class ObjectError(ContextcoreError):
    """The object cannot be read, for good: the message is the uploader's reason."""


class ObjectUnavailable(ContextcoreError):
    """The object store did not answer: try the upload again later."""


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_KEY_BYTES = 1024


def bucket_name(name: str) -> str:
    """``name`` when it is a plain S3 bucket name (3-63 of ``a-z 0-9 . -``, no ``..``, not an
    IP address); an ARN, a host, a port or credentials are not.

    Raises:
        ValueError: why it is not.
    """
    if not _BUCKET.fullmatch(name) or ".." in name:
        raise ValueError(f"{name[:100]!r} is not a plain S3 bucket name")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name
    raise ValueError(f"{name!r} is an IP address, not a bucket name")


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
    """Raises :class:`ObjectError` for anything but a plain ``s3://bucket/key`` or
    ``file:///absolute/path``."""
    parts = urlsplit(address)
    if parts.query or parts.fragment or "?" in address or "#" in address:
        raise ObjectError("an object address has no query and no fragment")
    path = unquote(parts.path)
    if _CONTROL.search(path):
        raise ObjectError("the object address holds a NUL or control character")
    if parts.scheme == "s3":
        try:
            bucket = bucket_name(parts.netloc)
        except ValueError as error:
            raise ObjectError(f"{error}: write s3://bucket/key") from None
        key = path.lstrip("/")
        if not key or len(key.encode()) > MAX_KEY_BYTES:
            raise ObjectError(f"an S3 key is 1 to {MAX_KEY_BYTES} bytes")
        return ObjectAddress("s3", bucket, key)
    if parts.scheme == "file":
        if parts.netloc not in {"", "localhost"}:
            raise ObjectError("a file:// address names no host")
        if not path.startswith("/"):
            raise ObjectError("a file:// address names an absolute path")
        return ObjectAddress("file", "", path)
    raise ObjectError(f"{parts.scheme[:20]!r} objects are not readable (s3:// or file://)")
