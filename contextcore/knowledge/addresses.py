"""Object addresses, parsed as the hostile input they are, and the two ways reading one fails:
pure, so the domain's ingestion knows them without the readers (objects.py: files, and S3
through boto3).

:func:`parse` refuses an address that is not plainly ``s3://bucket/key`` or ``file:///path``:
a NUL or control character once percent-decoded, an S3 "bucket" that is an ARN, a
``host:port`` or ``user:pw@host``, a query or a fragment; and a key or path a store, a proxy
or a file system could read as another one (issue 32, :func:`_plain`).

The tenant's prefix is checked lexically (objects.py: ``<organization id>/``), and the key is
sent as it is, so the prefix holds only if nobody between here and the bytes rewrites the key.
Stores and proxies do: they resolve dot segments (RFC 3986), merge slashes, take ``\\`` for
``/``, decode percent-escapes again, fold Unicode (NFKC: ``U+FF0E`` and ``U+2024`` are ``.``,
``U+FF0F`` is ``/``), drop zero-width characters or ``;parameters`` (``/..;/``). So a key is
refused when any of these readings of it has a segment that is empty or only dots, or a
backslash: then no reading climbs out of its first segment, the tenant's
(tests/unit/test_object_addresses.py states it as a property).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from schemas.errors import ContextcoreError


class ObjectError(ContextcoreError):
    """The object cannot be read, for good: the message is the uploader's reason."""


class ObjectUnavailable(ContextcoreError):
    """The object store did not answer: try the upload again later."""


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2}|[uU][0-9A-Fa-f]{4})")  # %2e, and IIS's %u002e
_LOOKALIKES = str.maketrans(
    {
        "\u3002": ".",  # IDEOGRAPHIC FULL STOP (and U+FF61, which NFKC makes it): IDNA's dots
        "\u2215": "/",  # DIVISION SLASH, FRACTION SLASH, BIG SOLIDUS: best-fit mappings'
        "\u2044": "/",
        "\u29f8": "/",
        "\u2216": "\\",  # SET MINUS, BIG REVERSE SOLIDUS
        "\u29f9": "\\",
    }
)
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


def _folded(path: str) -> str:
    """``path`` as a reader that folds Unicode may see it: NFKC, format characters (zero-width,
    bidi controls) dropped, and the lookalikes of ``.``, ``/`` and ``\\`` that NFKC leaves."""
    nfkc = unicodedata.normalize("NFKC", path)
    return "".join(c for c in nfkc if unicodedata.category(c) != "Cf").translate(_LOOKALIKES)


def _plain(path: str, what: str) -> None:
    """Refuse ``path`` (an S3 key, or a file path without its leading ``/``), once
    percent-decoded, unless no normalisation reads it as another path: no segment of only dots
    and spaces (``""``, ``.``, ``..``, ``...``, ``". ."``: Windows drops a name's trailing dots
    and spaces), nor one before a ``;``; no backslash; no percent-escape left (``%252e``
    decodes to ``%2e``, which a reader that decodes again takes for ``.``; ``%u002e``, IIS's);
    and the same of its Unicode-folded form (:func:`_folded`). ``%2F`` is a slash like any
    other: the rules see the decoded key, which is the key sent.

    Raises:
        ObjectError: why, naming the segment.
    """
    if _ESCAPE.search(path):
        raise ObjectError(
            f"the {what} is still percent-encoded once decoded (double encoding): decoded "
            "again, it names another object"
        )
    for form in (path, _folded(path)):
        if "\\" in form:
            raise ObjectError(
                f"the {what} holds a backslash (or a character that folds to one), which "
                "some stores read as '/'"
            )
        for segment in form.split("/"):
            if not segment.split(";", 1)[0].replace(".", "").strip():
                raise ObjectError(
                    f"the {what} has an empty, '.' or '..' segment ({segment[:20]!r}), or one "
                    "a store may read as such: normalised, it names another object"
                )


@dataclass(frozen=True)
class ObjectAddress:
    """Made by :func:`parse` only: its key has passed :func:`_plain`."""

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
    try:  # %c0%ae (an overlong ".", which some decoders take for one), a lone surrogate
        path = unquote(parts.path, errors="strict")
        path.encode()
    except UnicodeError:
        raise ObjectError("the object address is not UTF-8 once percent-decoded") from None
    if _CONTROL.search(path):
        raise ObjectError("the object address holds a NUL or control character")
    if parts.scheme == "s3":
        try:
            bucket = bucket_name(parts.netloc)
        except ValueError as error:
            raise ObjectError(f"{error}: write s3://bucket/key") from None
        key = path.removeprefix("/")  # the one slash after the bucket: "//" is an empty segment
        if not key or len(key.encode()) > MAX_KEY_BYTES:
            raise ObjectError(f"an S3 key is 1 to {MAX_KEY_BYTES} bytes")
        _plain(key, "object key")
        return ObjectAddress("s3", bucket, key)
    if parts.scheme == "file":
        if parts.netloc not in {"", "localhost"}:
            raise ObjectError("a file:// address names no host")
        if not path.startswith("/"):
            raise ObjectError("a file:// address names an absolute path")
        _plain(path[1:], "file path")
        return ObjectAddress("file", "", path)
    raise ObjectError(f"{parts.scheme[:20]!r} objects are not readable (s3:// or file://)")
