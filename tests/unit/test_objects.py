"""Object addresses are hostile input: what parse refuses, what check refuses before anything is
stored, and which files are read under the upload root."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest

from contextcore.knowledge.adapters.objects import ObjectReader
from contextcore.knowledge.addresses import ObjectError, bucket_name, parse

ORG = UUID("6f1c2a3b-0000-4000-8000-000000000001")
OTHER = "6f1c2a3b-0000-4000-8000-0000000000ff"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("s3://arn:aws:s3:us-east-1:123456789012:accesspoint/ap/key", "not a plain S3 bucket"),
        ("s3://store.example:9000/key", "not a plain S3 bucket"),
        ("s3://user:pw@store.example/key", "not a plain S3 bucket"),
        ("s3://192.168.0.10/key", "IP address"),
        ("s3://Docs/key", "not a plain S3 bucket"),
        ("s3://ab/key", "not a plain S3 bucket"),
        ("s3://a..b/key", "not a plain S3 bucket"),
        ("s3://docs/", "1 to 1024 bytes"),
        ("s3://docs/" + "k" * 1025, "1 to 1024 bytes"),
        ("s3://docs/a%00b", "NUL or control"),
        ("file:///uploads/ok.md%00.txt", "NUL or control"),
        ("file:///uploads/a%0Ab.md", "NUL or control"),
        ("file://elsewhere/uploads/a.md", "names no host"),
        ("file:///uploads/a.md?x=1", "no query"),
        ("file:///uploads/a.md#top", "no fragment"),
        ("file:relative.md", "absolute path"),
        ("http://example.com/a.md", "not readable"),
    ],
)
def test_parse_refuses_anything_but_a_plain_address(address: str, reason: str) -> None:
    with pytest.raises(ObjectError, match=reason):
        parse(address)


def test_a_plain_address_parses() -> None:
    assert parse("s3://docs.example-1/org/a%20b.md").key == "org/a b.md"
    assert parse("file:///uploads/guide.md").key == "/uploads/guide.md"
    assert bucket_name("docs.example-1") == "docs.example-1"


def test_s3_reads_only_allowed_buckets_and_the_scope_prefix() -> None:
    closed = ObjectReader(max_bytes=100)
    with pytest.raises(ObjectError, match="s3:// uploads are off"):
        closed.check(parse(f"s3://docs/{ORG}/a.md"), ORG)
    reader = ObjectReader(max_bytes=100, buckets=["docs"])
    reader.check(parse(f"s3://docs/{ORG}/a.md"), ORG)
    reader.check(parse("s3://docs/platform/a.md"), None)
    with pytest.raises(ObjectError, match="'private-backups' is not one this service reads"):
        reader.check(parse(f"s3://private-backups/{ORG}/payroll.md"), ORG)
    with pytest.raises(ObjectError, match="must start with"):
        reader.check(parse("s3://docs/platform/a.md"), ORG)
    with pytest.raises(ValueError, match="not a plain S3 bucket"):
        ObjectReader(max_bytes=100, buckets=["arn:aws:s3:::docs"])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The upload root; the tests' files are in the organization's folder of it."""
    root = tmp_path / "uploads"
    (root / str(ORG) / "team").mkdir(parents=True)
    (root / str(ORG) / "team" / "guide.md").write_bytes(b"# Guide\n\nRead me.")
    return root


def mine(root: Path) -> Path:
    return root / str(ORG)


def read(reader: ObjectReader, path: Path | str) -> bytes:
    address = parse(Path(path).as_uri() if isinstance(path, Path) else path)
    return asyncio.run(reader.read(address, ORG))


def test_a_regular_file_under_the_root_is_read(root: Path) -> None:
    assert read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "team" / "guide.md") == (
        b"# Guide\n\nRead me."
    )


def test_files_are_off_without_a_root(root: Path) -> None:
    with pytest.raises(ObjectError, match="file:// uploads are off"):
        read(ObjectReader(max_bytes=100), mine(root) / "team" / "guide.md")


def test_a_named_pipe_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(mine(root) / "pipe.md")  # nothing ever writes: a blocking open would hang for good
    with pytest.raises(ObjectError, match="names a named pipe, not a regular file"):
        read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "pipe.md")


def test_a_socket_and_a_directory_are_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(mine(root))  # a socket's path is short (108 bytes): bind it relatively
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("sock.md")
        with pytest.raises(ObjectError, match="names a socket"):
            read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "sock.md")
    with pytest.raises(ObjectError, match="names a directory"):
        read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "team")


def test_a_symbolic_link_anywhere_under_the_root_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_bytes(b"not for upload")
    os.symlink(outside / "secret.md", mine(root) / "link.md")
    os.symlink(outside, mine(root) / "linked-folder")
    os.symlink(mine(root) / "team" / "guide.md", mine(root) / "inside-link.md")
    reader = ObjectReader(max_bytes=100, file_root=root)
    for path in (
        mine(root) / "link.md",
        mine(root) / "linked-folder" / "secret.md",
        mine(root) / "inside-link.md",
    ):
        with pytest.raises(ObjectError, match="symbolic link"):
            read(reader, path)


def test_paths_out_of_the_root_are_refused(root: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.md").write_bytes(b"x")
    reader = ObjectReader(max_bytes=100, file_root=root)
    for path in ("file:///etc/passwd", f"file://{root}"):
        with pytest.raises(ObjectError, match="outside the upload root"):
            read(reader, path)
    with pytest.raises(ObjectError, match=r"'\.\.' segment"):  # parse's rule, issue 32
        read(reader, f"file://{root}/../outside.md")


def test_a_file_in_another_scopes_folder_is_refused(root: Path) -> None:
    """Issue 18: as S3 keys, files are read from the uploader's folder of the root only."""
    other = root / OTHER
    other.mkdir()
    (other / "theirs.md").write_bytes(b"# Theirs")
    (root / "platform").mkdir()
    (root / "platform" / "guide.md").write_bytes(b"# Shared")
    (root / "loose.md").write_bytes(b"# In no folder")
    reader = ObjectReader(max_bytes=100, file_root=root)
    for path in (other / "theirs.md", root / "platform" / "guide.md", root / "loose.md"):
        with pytest.raises(ObjectError, match=f"must be under '{ORG}/'"):
            read(reader, path)
    assert asyncio.run(reader.read(parse((root / "platform" / "guide.md").as_uri()), None)) == (
        b"# Shared"
    )
    with pytest.raises(ObjectError, match="must be under 'platform/'"):
        asyncio.run(reader.read(parse((mine(root) / "team" / "guide.md").as_uri()), None))


def test_a_file_over_the_limit_is_refused(root: Path) -> None:
    (mine(root) / "big.md").write_bytes(b"x" * 101)
    with pytest.raises(ObjectError, match="101 bytes, over the 100-byte limit"):
        read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "big.md")
    with pytest.raises(ObjectError, match="does not exist"):
        read(ObjectReader(max_bytes=100, file_root=root), mine(root) / "missing.md")


def test_a_hard_link_to_another_scopes_file_is_refused(root: Path, tmp_path: Path) -> None:
    """Issue 32: a hard link in A's folder to B's file, or to a file outside the root, is a
    regular file under A's folder whose bytes are someone else's; only its link count tells,
    so only a file with one link is read (A's own file linked twice too)."""
    (root / OTHER).mkdir()
    (root / OTHER / "secret.md").write_bytes(b"# B only")
    (tmp_path / "outside.md").write_bytes(b"# Outside")
    os.link(root / OTHER / "secret.md", mine(root) / "theirs.md")
    os.link(tmp_path / "outside.md", mine(root) / "outside.md")
    os.link(mine(root) / "team" / "guide.md", mine(root) / "guide-again.md")
    reader = ObjectReader(max_bytes=100, file_root=root)
    for name in ("theirs.md", "outside.md", "guide-again.md", "team/guide.md"):
        with pytest.raises(ObjectError, match="the file has 2 hard links"):
            read(reader, mine(root) / name)
    os.unlink(mine(root) / "guide-again.md")  # one name again: the count is read at the open
    assert read(reader, mine(root) / "team" / "guide.md") == b"# Guide\n\nRead me."


_IN_A_MOUNT_NAMESPACE = """
import asyncio, json, subprocess, sys
from pathlib import Path
from uuid import UUID
from contextcore.knowledge.addresses import ObjectError, parse
from contextcore.knowledge.adapters.objects import ObjectReader

root, organization, setup = sys.argv[1], UUID(sys.argv[2]), json.loads(sys.argv[3])
paths = sys.argv[4:]
for mount in setup["mounts"]:
    done = subprocess.run(["mount", *mount], capture_output=True, text=True)
    if done.returncode:
        print(done.stderr, file=sys.stderr)
        sys.exit(77)  # not allowed to mount here
for path, text in setup["files"].items():
    Path(path).write_text(text)
reader = ObjectReader(max_bytes=100, file_root=root)
read = {}
for path in paths:
    try:
        read[path] = asyncio.run(reader.read(parse("file://" + path), organization)).decode()
    except ObjectError as error:
        read[path] = str(error)
print(json.dumps(read))
"""


def test_a_file_on_another_mount_under_the_root_is_refused(root: Path) -> None:
    """Issue 32: a bind mount of B's folder into A's, of B's file onto a name in A's folder
    (one link each), or another file system mounted under the root is refused; A's own file
    still reads. The mounts are made in a private mount namespace (``unshare``, as root):
    where that is not allowed, the test is skipped."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("no unshare(1) or mount(8)")
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (needs root)")
    (root / OTHER).mkdir()
    (root / OTHER / "secret.md").write_bytes(b"# B only")
    for folder in ("bound", "tmpfs"):
        (mine(root) / folder).mkdir()
    (mine(root) / "bound.md").write_bytes(b"# A's placeholder")
    setup = {
        "mounts": [
            ["--bind", str(root / OTHER), str(mine(root) / "bound")],
            ["--bind", str(root / OTHER / "secret.md"), str(mine(root) / "bound.md")],
            ["-t", "tmpfs", "-o", "size=1m", "none", str(mine(root) / "tmpfs")],
        ],
        "files": {str(mine(root) / "tmpfs" / "notes.md"): "# On a tmpfs"},
    }
    refused = [
        mine(root) / "bound" / "secret.md",
        mine(root) / "bound.md",
        mine(root) / "tmpfs" / "notes.md",
    ]
    guide = mine(root) / "team" / "guide.md"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c"]
        + [_IN_A_MOUNT_NAMESPACE, str(root), str(ORG), json.dumps(setup)]
        + [str(path) for path in [*refused, guide]],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        check=False,
    )
    if done.returncode == 77:
        pytest.skip(f"mount(8) is not allowed here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    for path in refused:
        assert "on another mount than the upload root" in read[str(path)], read
    assert read[str(guide)] == "# Guide\n\nRead me."
