"""Issue 32: an object key (or a file path) that a store, a proxy or a file system could
normalise into another one is refused by parse, before anything is stored. The tenant prefix is
checked lexically and the key sent as it is, so the property that matters is the one the
hypothesis test states: every key the rules accept stays under the tenant's prefix through
every normalisation a reader may apply, alone or in a chain."""

from __future__ import annotations

import posixpath
import re
import unicodedata
from collections.abc import Callable
from urllib.parse import quote, unquote, urljoin, urlsplit
from uuid import UUID

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from contextcore.knowledge.addresses import ObjectError, parse
from contextcore.knowledge.objects import ObjectReader

ORG = "6f1c2a3b-0000-4000-8000-000000000001"
OTHER = "6f1c2a3b-0000-4000-8000-0000000000ff"
DOTS = "'.' or '..' segment"


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (f"{ORG}/../{OTHER}/secret.md", DOTS),
        (f"{ORG}/./../{OTHER}/secret.md", DOTS),
        (f"{ORG}/.../secret.md", DOTS),  # Windows reads "..." as "" (trailing dots dropped)
        (f"{ORG}/. ./secret.md", DOTS),
        (f"{ORG}/ /secret.md", DOTS),
        (f"{ORG}//secret.md", DOTS),  # merge_slashes: a different key to S3, the same to nginx
        (f"/{ORG}/secret.md", DOTS),  # s3://docs//org/...: once read as the key "org/..."
        (f"{ORG}/folder/", DOTS),
        (f"{ORG}/%2e%2e/{OTHER}/secret.md", DOTS),  # one decoding: the key is "org/../other"
        (f"{ORG}/%2E./{OTHER}/secret.md", DOTS),
        (f"{ORG}%2F..%2F{OTHER}/secret.md", DOTS),  # %2F is a slash once decoded
        (f"{ORG}/..;/{OTHER}/secret.md", DOTS),  # Tomcat drops ;parameters
        (f"{ORG}/..;jsessionid=1/{OTHER}/secret.md", DOTS),
        (f"{ORG}/\uff0e\uff0e/{OTHER}/secret.md", DOTS),  # FULLWIDTH FULL STOP
        (f"{ORG}/%EF%BC%8E%EF%BC%8E/{OTHER}/secret.md", DOTS),  # the same, percent-encoded
        (f"{ORG}/\u2024\u2024/{OTHER}/secret.md", DOTS),  # ONE DOT LEADER
        (f"{ORG}/\u2025/{OTHER}/secret.md", DOTS),  # TWO DOT LEADER: ".." under NFKC
        (f"{ORG}/\ufe52./{OTHER}/secret.md", DOTS),  # SMALL FULL STOP
        (f"{ORG}/\u3002\u3002/{OTHER}/secret.md", DOTS),  # IDEOGRAPHIC FULL STOP (IDNA's dot)
        (f"{ORG}/\uff61./{OTHER}/secret.md", DOTS),
        (f"{ORG}/..\uff0f{OTHER}/secret.md", DOTS),  # FULLWIDTH SOLIDUS
        (f"{ORG}/..\u2215{OTHER}/secret.md", DOTS),  # DIVISION SLASH (best-fit mappings)
        (f"{ORG}/.\u200b./{OTHER}/secret.md", DOTS),  # a zero-width space a folder drops
        (f"{ORG}/%252e%252e/{OTHER}/secret.md", "still percent-encoded"),
        (f"{ORG}/%252F..%252F{OTHER}/secret.md", "still percent-encoded"),
        (f"{ORG}/%u002e%u002e/{OTHER}/secret.md", "still percent-encoded"),
        (f"{ORG}/..\\{OTHER}/secret.md", "backslash"),
        (f"{ORG}/..%5C{OTHER}/secret.md", "backslash"),
        (f"{ORG}/..\uff3c{OTHER}/secret.md", "backslash"),  # FULLWIDTH REVERSE SOLIDUS
        (f"{ORG}/..\u29f9{OTHER}/secret.md", "backslash"),
        (f"{ORG}/%c0%ae%c0%ae/{OTHER}/secret.md", "not UTF-8"),  # an overlong "."
        (f"{ORG}/a\ud800.md", "not UTF-8"),  # a lone surrogate (once a UnicodeEncodeError)
    ],
)
def test_a_key_a_store_could_normalise_into_another_is_refused(key: str, reason: str) -> None:
    with pytest.raises(ObjectError, match=re.escape(reason)):
        parse(f"s3://docs/{key}")


@pytest.mark.parametrize(
    "path",
    [
        f"/srv/uploads/{ORG}/../{OTHER}/secret.md",
        f"/srv/uploads/{ORG}/%2e%2e/{OTHER}/secret.md",
        f"/srv/uploads/./{ORG}/guide.md",
        f"/srv/uploads/{ORG}//guide.md",
        "/",
    ],
)
def test_a_file_path_follows_the_same_rule(path: str) -> None:
    """A file path is opened as the normalised components it names, so a ".." cannot leave
    the uploader's folder (test_objects.py); it is refused as early as a key is, for one rule."""
    with pytest.raises(ObjectError, match=re.escape(DOTS)):
        parse(f"file://{path}")


@pytest.mark.parametrize(
    ("address", "key"),
    [
        (f"s3://docs/{ORG}/a.b/c..d/.hidden/x..md", f"{ORG}/a.b/c..d/.hidden/x..md"),
        (f"s3://docs/{ORG}/100%25 sure.md", f"{ORG}/100% sure.md"),
        (f"s3://docs/{ORG}/a%2Fb.md", f"{ORG}/a/b.md"),
        (f"s3://docs/{ORG}/v1;final.md", f"{ORG}/v1;final.md"),
        (f"s3://docs/{ORG}/r\u00e9sum\u00e9 \u5831\u544a\u3002md", f"{ORG}/résumé 報告。md"),
    ],
)
def test_plain_keys_with_dots_percents_and_unicode_in_names_are_read(
    address: str, key: str
) -> None:
    parsed = parse(address)
    assert parsed.key == key
    ObjectReader(max_bytes=1, buckets=["docs"]).check(parsed, UUID(ORG))


# ------------------------------------------------------------------ the property

_IGNORED = dict.fromkeys(i for i in range(0x80, 0x110000) if unicodedata.category(chr(i)) == "Cf")


def _nfkc(path: str) -> str:
    return unicodedata.normalize("NFKC", path)


def _lookalikes(path: str) -> str:
    folded = _nfkc(path).translate(_IGNORED)
    for chars, to in (("\u3002", "."), ("\u2215\u2044\u29f8", "/"), ("\u2216\u29f9", "\\")):
        for char in chars:
            folded = folded.replace(char, to)
    return folded


def _params(path: str) -> str:
    return "/".join(segment.split(";", 1)[0] for segment in path.split("/"))


def _windows(path: str) -> str:
    return "/".join(s.rstrip(". ") for s in path.replace("\\", "/").split("/"))


def _merge_slashes(path: str) -> str:
    return re.sub("/+", "/", path)


def _rfc3986(path: str) -> str:
    """The key as an HTTP store resolves its request path (remove_dot_segments)."""
    return unquote(urlsplit(urljoin("http://store/docs/", quote(path, safe="/"))).path)[6:]


NORMALISERS: list[Callable[[str], str]] = [
    unquote,
    _nfkc,
    _lookalikes,
    _params,
    _windows,
    _merge_slashes,
    _rfc3986,
    posixpath.normpath,
]
PIECES = [
    "/", ".", "..", "...", " ", ";", "%2e", "%2E", "%2f", "%25", "%252e", "%5c", "%u002e",
    "\\", "\uff0e", "\u2024", "\u2025", "\u3002", "\uff61", "\uff0f", "\u2215", "\uff3c",
    "\u200b", "\u00ad", "%c0%ae", "%EF%BC%8E", "a", "b.md", "\u00e9",
]  # fmt: skip


@settings(max_examples=1000)
@given(tail=st.lists(st.sampled_from(PIECES) | st.text(max_size=2), max_size=10).map("".join))
@example(tail="a/b.md")
@example(tail="..")
def test_every_accepted_key_stays_under_the_prefix_however_it_is_normalised(tail: str) -> None:
    reader = ObjectReader(max_bytes=1, buckets=["docs"])
    try:
        address = parse(f"s3://docs/{ORG}/{tail}")
        reader.check(address, UUID(ORG))
    except ObjectError:
        return
    assert posixpath.normpath(address.key) == address.key
    for normalise in NORMALISERS:  # alone, then after every other
        for then in NORMALISERS:
            seen = posixpath.normpath(_merge_slashes(then(normalise(address.key))))
            assert seen.startswith(f"{ORG}/"), (address.key, normalise, then, seen)
            assert ".." not in seen.split("/"), (address.key, seen)
