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
``/``, decode percent-escapes again (and ``+`` as a space, as a form does), trim spaces, cut
``;parameters`` (``/..;/``) or a ``?query``, fold Unicode (NFKC: ``U+FF0E`` and ``U+2024`` are
``.``, ``U+FF0F`` is ``/``, ``U+FF1F`` is ``?``), fold accents away (combining marks dropped),
or drop "invisible" characters (Unicode's Default_Ignorable_Code_Point: zero-width characters,
variation selectors, the Hangul fillers; UTS #46 maps them all to nothing). So a key is
refused when its :func:`_skeleton`, the reading that does all of these at once, or the key
itself has a segment a reader may take for nothing or for dots, a backslash or a
percent-escape: then no reading climbs out of its first segment, the tenant's
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
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: no name holds one
_ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2}|[uU][0-9A-Fa-f]{4})")  # %2e, and IIS's %u002e
_CUT = re.compile(r"[;?#]")  # where a reader ends a segment: ;parameters, ?query, #fragment
_LOOKALIKES = str.maketrans(
    {
        "\u3002": ".",  # IDEOGRAPHIC FULL STOP (and U+FF61, U+FE12, which NFKD make it): IDNA's
        "\u2215": "/",  # DIVISION SLASH, FRACTION SLASH, BIG SOLIDUS: best-fit mappings'
        "\u2044": "/",
        "\u29f8": "/",
        "\u2216": "\\",  # SET MINUS, BIG REVERSE SOLIDUS
        "\u29f9": "\\",
    }
)
# Unicode's Default_Ignorable_Code_Point, from its definition in DerivedCoreProperties.txt
# (Other_Default_Ignorable_Code_Point + Cf + Variation_Selector - White_Space - U+FFF9..FFFB -
# U+13430..1343F - Prepended_Concatenation_Mark), the same from Unicode 14.0 (Python 3.11's
# unicodedata) to 16.0. unicodedata has no such property: tests/unit/test_object_addresses.py
# checks each range against the categories and names it can.
DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),  # Cf  SOFT HYPHEN
    (0x034F, 0x034F),  # Mn  COMBINING GRAPHEME JOINER
    (0x061C, 0x061C),  # Cf  ARABIC LETTER MARK
    (0x115F, 0x1160),  # Lo  HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),  # Mn  KHMER VOWEL INHERENT AQ, AA
    (0x180B, 0x180F),  # Mn  MONGOLIAN FREE VARIATION SELECTOR 1-4; Cf 180E VOWEL SEPARATOR
    (0x200B, 0x200F),  # Cf  ZERO WIDTH SPACE, (NON-)JOINER, LEFT-TO-RIGHT/RIGHT-TO-LEFT MARK
    (0x202A, 0x202E),  # Cf  bidi embeddings, pop and overrides
    (0x2060, 0x206F),  # Cf  WORD JOINER .. NOMINAL DIGIT SHAPES; Cn 2065, reserved
    (0x3164, 0x3164),  # Lo  HANGUL FILLER
    (0xFE00, 0xFE0F),  # Mn  VARIATION SELECTOR-1..16
    (0xFEFF, 0xFEFF),  # Cf  ZERO WIDTH NO-BREAK SPACE (the byte order mark)
    (0xFFA0, 0xFFA0),  # Lo  HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),  # Cn  reserved
    (0x1BCA0, 0x1BCA3),  # Cf  SHORTHAND FORMAT LETTER OVERLAP .. UP STEP
    (0x1D173, 0x1D17A),  # Cf  MUSICAL SYMBOL BEGIN BEAM .. END PHRASE
    (0xE0000, 0xE0FFF),  # Cf  tags (E0001, E0020..E007F); Mn  VARIATION SELECTOR-17..256
    #                      (E0100..E01EF); Cn  the rest, reserved
)
_IGNORABLE = frozenset(chr(c) for first, last in DEFAULT_IGNORABLE for c in range(first, last + 1))
# Marks (accent folding drops Mn, and some folders every M), format characters, and code points
# this Unicode (14.0) has not assigned: a reader on a newer one may know one as a mark.
_DROPPED_CATEGORIES = frozenset({"Mn", "Mc", "Me", "Cf", "Cn"})
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


def _visible(text: str) -> str:
    """``text`` without the characters some reader deletes (:data:`DEFAULT_IGNORABLE` and
    :data:`_DROPPED_CATEGORIES`)."""
    return "".join(
        c
        for c in text
        if c not in _IGNORABLE and unicodedata.category(c) not in _DROPPED_CATEGORIES
    )


def _skeleton(path: str) -> str:
    """``path`` as the most folding reader sees it: invisible characters and marks dropped,
    NFKD (which NFKC only recomposes), dropped again (NFKD makes ``U+3164`` ``U+1160``, and a
    character its base and marks), and the lookalikes of ``.``, ``/`` and ``\\`` that NFKD leaves
    mapped to them.

    A reader deletes at most what is deleted here, and a segment with characters taken away is
    no less :func:`_blank`; dots, spaces, ``+``, ``;``, ``?`` and ``#`` are their own NFKD, and
    NFKC only recomposes NFKD's output. So a key whose own segments and skeleton's are not blank
    has none in a reading that drops some of these characters, in any order, with or without
    NFKC or NFKD.
    """
    return _visible(unicodedata.normalize("NFKD", _visible(path))).translate(_LOOKALIKES)


def _blank(segment: str) -> bool:
    """True of a segment a reader may take for nothing or for dots: once cut at ``;``, ``?`` or
    ``#``, only dots and spaces (``""``, ``.``, ``..``, ``...``, ``". ."``: trimmed, or Windows
    dropping a name's trailing dots and spaces), ``+`` counted as a space (a form's encoding)."""
    name = _CUT.split(segment, maxsplit=1)[0]
    return not name.replace("+", " ").replace(".", "").strip()


def _plain(path: str, what: str) -> None:
    """Refuse ``path`` (an S3 key, or a file path without its leading ``/``), once
    percent-decoded, unless no normalisation reads it as another path: neither it nor its
    :func:`_skeleton` has a :func:`_blank` segment, a backslash, or a percent-escape (``%252e``
    decodes to ``%2e``, which a reader that decodes again takes for ``.``; ``%u002e``, IIS's;
    ``%\uff12e``, NFKC's ``%2e``). ``%2F`` is a slash like any other: the rules see the decoded
    key, which is the key sent.

    Raises:
        ObjectError: why, naming the segment.
    """
    for form in (path, _skeleton(path)):
        if _ESCAPE.search(form):
            raise ObjectError(
                f"the {what} is still percent-encoded once decoded (double encoding), or once "
                "Unicode-folded: decoded again, it names another object"
            )
        if "\\" in form:
            raise ObjectError(
                f"the {what} holds a backslash (or a character that folds to one), which "
                "some stores read as '/'"
            )
        for segment in form.split("/"):
            if _blank(segment):
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
