"""Reading an uploaded object: ``s3://bucket/key`` through the S3 API, ``file:///path`` from disk
(the adapter of ingestion's :class:`~.ingest.ObjectStore` port).

Addresses are hostile input. :func:`~.addresses.parse` refuses an address that is not plainly
one of the two (addresses.py), and :meth:`ObjectReader.check` refuses, before a source exists
and before a byte is read, what this service will not read:

* S3: a bucket the configuration does not name (``buckets``, the allow-list: empty, none), and,
  with ``tenant_prefixes`` (the default), a key that does not start with the uploader's
  organization id and a slash (``platform/`` for the platform's documents): a lexical check,
  which holds because :func:`~.addresses.parse` refused every key a store could normalise into
  another (dot segments and the rest, issue 32). The endpoint is configuration, never the
  address, so an address cannot send the signed request elsewhere.
* files: anything when no ``file_root`` is set, and any path outside it; with
  ``tenant_prefixes``, a path not under the uploader's folder of the root (``<organization
  id>/``, ``platform/``), as for S3 keys: one tenant never names another's file.

A file is opened one path component at a time from the root with ``O_NOFOLLOW`` (a symbolic
link anywhere is refused, so a link swapped in after the check cannot lead out), the last one
with ``O_NONBLOCK`` too (a named pipe cannot block the reading thread), and only a regular file
is read, never past ``max_bytes``. What was opened is checked on its descriptor (``fstat``), so
nothing swapped in after a check is read unchecked:

* a file with more than one hard link is refused (issue 32): a link in A's folder to B's file
  (or to one outside the root) is a name in A's folder for B's bytes, and nothing but the link
  count tells it from A's own file. The count is the inode's at the ``fstat``: a link made
  after it is a new name for a file that was only A's; a file whose other names were all
  removed before it is read as A's (it is then only in A's folder, as if moved there).
* a file on another mount than the root is refused: a bind mount (of B's folder, or of B's file
  onto a name in A's folder) or another file system mounted under the root. The mount is the
  descriptor's ``mnt_id`` (``/proc/self/fdinfo``, Linux), which tells a bind mount of the same
  file system apart; without ``/proc``, its ``st_dev``, which does not. So the upload volume is
  mounted at the root itself, never under it.

An S3 object is read in pieces under one deadline, never past ``max_bytes`` either.

A refused address or a missing object is an :class:`ObjectError` (the uploader is told why); a
store that does not answer is :class:`ObjectUnavailable` (the upload is tried again, a bounded
number of times).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import UUID

from contextcore.knowledge.addresses import (
    ObjectAddress,
    ObjectError,
    ObjectUnavailable,
    bucket_name,
)

log = logging.getLogger("contextcore.knowledge")

_PIECE = 1024 * 1024


class ObjectReader:
    def __init__(
        self,
        *,
        max_bytes: int,
        file_root: Path | None = None,
        buckets: Iterable[str] = (),
        s3_endpoint_url: str | None = None,
        s3_region: str | None = None,
        tenant_prefixes: bool = True,
        timeout_s: float = 30.0,
        deadline_s: float = 120.0,
    ) -> None:
        """``timeout_s`` bounds each network call, ``deadline_s`` one whole read."""
        self.max_bytes = max_bytes
        self.file_root = Path(os.path.realpath(file_root)) if file_root is not None else None
        self._roots = (
            () if file_root is None else tuple({os.path.normpath(file_root), str(self.file_root)})
        )
        self.buckets = frozenset(bucket_name(b) for b in buckets)
        self.s3_endpoint_url = s3_endpoint_url
        self.s3_region = s3_region
        self.tenant_prefixes = tenant_prefixes
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self._s3: Any = None

    def check(self, address: ObjectAddress, organization_id: UUID | None) -> None:
        """Refuse, before anything is stored or read, an address this service will not read.

        Raises:
            ObjectError: why.
        """
        prefix = "platform" if organization_id is None else str(organization_id)
        if address.scheme == "file":
            components = self._relative(address.key)
            if self.tenant_prefixes and (len(components) < 2 or components[0] != prefix):
                raise ObjectError(
                    f"the file must be under {prefix + '/'!r} of the upload root for this scope"
                )
            return
        if not self.buckets:
            raise ObjectError("s3:// uploads are off (no CONTEXTCORE_UPLOAD_S3_BUCKETS)")
        if address.bucket not in self.buckets:
            raise ObjectError(f"the bucket {address.bucket!r} is not one this service reads")
        if self.tenant_prefixes and not address.key.startswith(prefix + "/"):
            raise ObjectError(f"the object key must start with {prefix + '/'!r} for this scope")

    async def read(self, address: ObjectAddress, organization_id: UUID | None) -> bytes:
        self.check(address, organization_id)
        if address.scheme == "file":
            return await asyncio.to_thread(self._read_file, address.key)
        return await asyncio.to_thread(self._read_s3, address)

    # ---------------------------------------------------------------------------- files

    def _relative(self, path: str) -> list[str]:
        """The components of ``path`` under the upload root (lexically: no ``..`` out)."""
        if self.file_root is None:
            raise ObjectError("file:// uploads are off (no CONTEXTCORE_UPLOAD_FILE_ROOT)")
        normal = os.path.normpath(path)
        for root in self._roots:
            if normal.startswith(root.rstrip("/") + "/"):
                return normal[len(root.rstrip("/")) + 1 :].split("/")
        raise ObjectError("the file is outside the upload root")

    def _read_file(self, path: str) -> bytes:
        assert self.file_root is not None
        *folders, name = self._relative(path)
        opened: list[int] = []
        try:
            fd = os.open(self.file_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            opened.append(fd)
            root = _mount(fd, os.fstat(fd))
            for folder in folders:
                fd = os.open(
                    folder,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=fd,
                )
                opened.append(fd)
            _regular(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
            )
            opened.append(fd)
            info = os.fstat(fd)  # what was opened, whatever was swapped in since the stat
            _regular(info.st_mode)
            if _mount(fd, info) != root:
                raise ObjectError(
                    "the file is on another mount than the upload root (a bind mount, or "
                    "another file system under the root): only the root's own are read"
                )
            if info.st_nlink > 1:
                raise ObjectError(
                    f"the file has {info.st_nlink} hard links: another name may be another "
                    "scope's file, or one outside the upload root, so only a file with one "
                    "link is read (copy it instead of linking it)"
                )
            if info.st_size > self.max_bytes:
                raise ObjectError(
                    f"the file is {info.st_size} bytes, over the {self.max_bytes}-byte limit"
                )
            return self._read_fd(fd)
        except OSError as error:
            raise ObjectError(_file_error(error)) from None
        finally:
            for descriptor in reversed(opened):
                os.close(descriptor)

    def _read_fd(self, fd: int) -> bytes:
        pieces: list[bytes] = []
        size = 0
        while size <= self.max_bytes:
            piece = os.read(fd, min(_PIECE, self.max_bytes + 1 - size))
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)
            size += len(piece)
        raise ObjectError(f"the file is over the {self.max_bytes}-byte limit")

    # ------------------------------------------------------------------------------- S3

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

        deadline = time.monotonic() + self.deadline_s
        try:
            response = self._client().get_object(Bucket=address.bucket, Key=address.key)
            body = response["Body"]
            try:
                size = int(response.get("ContentLength") or 0)
                if size > self.max_bytes:
                    raise ObjectError(
                        f"the object is {size} bytes, over the {self.max_bytes} limit"
                    )
                pieces: list[bytes] = []
                read = 0
                while read <= self.max_bytes:
                    if time.monotonic() > deadline:
                        raise ObjectUnavailable(
                            f"the object store sent the object too slowly (over "
                            f"{self.deadline_s:g} s)"
                        )
                    piece: bytes = body.read(min(_PIECE, self.max_bytes + 1 - read))
                    if not piece:
                        return b"".join(pieces)
                    pieces.append(piece)
                    read += len(piece)
                raise ObjectError(f"the object is over the {self.max_bytes}-byte limit")
            finally:
                body.close()
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code in {"NoSuchKey", "NoSuchBucket", "404", "AccessDenied", "403"}:
                raise ObjectError(f"the object cannot be read: {code}") from error
            log.warning("the object store refused %s: %s", address.bucket, error)
            refusal = code if code.isalnum() else type(error).__name__
            raise ObjectUnavailable(f"the object store refused: {refusal}") from error
        except BotoCoreError as error:
            # the error's text names the endpoint and the request: the operator's, in the log
            log.warning("the object store did not answer for %s: %s", address.bucket, error)
            raise ObjectUnavailable(
                f"the object store did not answer ({type(error).__name__})"
            ) from error


def _mount(fd: int, info: os.stat_result) -> tuple[str, int]:
    """The mount ``fd`` is on: its mount's id (Linux, ``/proc``), which differs for a bind mount
    of the same file system too; else its file system, ``st_dev``. Not ``st_dev`` when the id
    is known: an overlayfs whose layers are on different file systems gives its files the
    ``st_dev`` of their layer, not the overlay's (its folders have the overlay's)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as fdinfo:
            for line in fdinfo:
                if line.startswith(b"mnt_id:"):
                    return "mount", int(line.split()[1])
    except (OSError, ValueError):
        pass
    return "device", info.st_dev


def _regular(mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise ObjectError(
            "the path holds a symbolic link (links are not followed under the upload root)"
        )
    if not stat.S_ISREG(mode):
        raise ObjectError(f"the address names a {_kind(mode)}, not a regular file")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "named pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _file_error(error: OSError) -> str:
    if error.errno == errno.ENOENT:
        return "the file does not exist"
    if error.errno == errno.ELOOP:
        return "the path holds a symbolic link (links are not followed under the upload root)"
    if error.errno == errno.ENOTDIR:
        return "the path holds a symbolic link or a file where a folder should be"
    if error.errno in {errno.EACCES, errno.EPERM}:
        return "the file is not readable"
    return f"the file cannot be read: {error.strerror or type(error).__name__}"
