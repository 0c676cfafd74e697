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
from urllib.parse import quote, unquote, unquote_plus, urljoin, urlsplit
from uuid import UUID

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from contextcore.knowledge.adapters.objects import ObjectReader
from contextcore.knowledge.addresses import DEFAULT_IGNORABLE, ObjectError, parse

ORG = "6f1c2a3b-0000-4000-8000-000000000001"
OTHER = "6f1c2a3b-0000-4000-8000-0000000000ff"
DOTS = "'.' or '..' segment"
PERSIAN = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0645"  # "I want", with a ZERO WIDTH NON-JOINER


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
        # the second attacker's keys: characters UTS #46, "strip invisible" and accent folding drop
        (f"{ORG}/..\u034f/{OTHER}/secret.md", DOTS),  # COMBINING GRAPHEME JOINER
        (f"{ORG}/..\ufe0f/{OTHER}/secret.md", DOTS),  # VARIATION SELECTOR-16
        (f"{ORG}/..\u3164/{OTHER}/secret.md", DOTS),  # HANGUL FILLER
        (f"{ORG}/.\u0307./{OTHER}/secret.md", DOTS),  # COMBINING DOT ABOVE between the dots
        (f"{ORG}/..+/{OTHER}/secret.md", DOTS),  # a form reads "+" as a space, then trimmed
        (f"{ORG}/..%2B/{OTHER}/secret.md", DOTS),  # the same "+", percent-encoded
        (f"{ORG}/..\uff0b/{OTHER}/secret.md", DOTS),  # FULLWIDTH PLUS SIGN: "+" under NFKC
        (f"{ORG}/..\U000e0100/{OTHER}/secret.md", DOTS),  # VARIATION SELECTOR-17
        (f"{ORG}/..\u115f\u1160/{OTHER}/secret.md", DOTS),  # HANGUL CHOSEONG, JUNGSEONG FILLER
        (f"{ORG}/..\uffa0/{OTHER}/secret.md", DOTS),  # HALFWIDTH HANGUL FILLER
        (f"{ORG}/..\u17b4/{OTHER}/secret.md", DOTS),  # KHMER VOWEL INHERENT AQ
        (f"{ORG}/..\u180b/{OTHER}/secret.md", DOTS),  # MONGOLIAN FREE VARIATION SELECTOR ONE
        (f"{ORG}/..\U000e0041/{OTHER}/secret.md", DOTS),  # TAG LATIN CAPITAL LETTER A
        (f"{ORG}/..\u20dd/{OTHER}/secret.md", DOTS),  # COMBINING ENCLOSING CIRCLE (Me)
        (f"{ORG}/..\u0903/{OTHER}/secret.md", DOTS),  # DEVANAGARI SIGN VISARGA (Mc)
        (f"{ORG}/..\U00011f00/{OTHER}/secret.md", DOTS),  # a mark from Unicode 15, unknown to 14
        (f"{ORG}/\u0301/{OTHER}/secret.md", DOTS),  # only a mark: empty, accents folded
        (f"{ORG}/..%3F/{OTHER}/secret.md", DOTS),  # decoded again, "?" ends the path at "<A>/.."
        (f"{ORG}/..\uff1f/{OTHER}/secret.md", DOTS),  # FULLWIDTH QUESTION MARK: "?" under NFKC
        (f"{ORG}/..%23/{OTHER}/secret.md", DOTS),  # "#", a fragment
        (f"{ORG}/%\uff12e%\uff12e/{OTHER}/secret.md", "still percent-encoded"),  # NFKC: %2e
        (f"{ORG}/%\u200b2e%\u200b2e/{OTHER}/secret.md", "still percent-encoded"),
        (f"{ORG}/..\x80/{OTHER}/secret.md", "control character"),  # C1 controls, as C0
        (f"{ORG}/..%C2%9F/{OTHER}/secret.md", "control character"),
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
        # invisible characters and marks inside a name are read: only a segment they would
        # leave blank is refused
        (f"s3://docs/{ORG}/re\u0301sume\u0301.md", f"{ORG}/re\u0301sume\u0301.md"),  # NFD
        (f"s3://docs/{ORG}/{PERSIAN}.md", f"{ORG}/{PERSIAN}.md"),  # ZWNJ is spelling there
        (f"s3://docs/{ORG}/\u2764\ufe0f notes.md", f"{ORG}/\u2764\ufe0f notes.md"),
        (f"s3://docs/{ORG}/c++/a+b.md", f"{ORG}/c++/a+b.md"),
        (f"s3://docs/{ORG}/why%3F.md", f"{ORG}/why?.md"),
        (f"s3://docs/{ORG}/..a/b.md", f"{ORG}/..a/b.md"),
    ],
)
def test_plain_keys_with_dots_percents_and_unicode_in_names_are_read(
    address: str, key: str
) -> None:
    parsed = parse(address)
    assert parsed.key == key
    ObjectReader(max_bytes=1, buckets=["docs"]).check(parsed, UUID(ORG))


# ------------------------------------------------------------------ the characters readers drop

IGNORABLE = {c for first, last in DEFAULT_IGNORABLE for c in range(first, last + 1)}
EVERY = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def _where(test: Callable[[str, str], bool]) -> set[int]:
    """The code points whose (category, name) pass ``test``."""
    return {c for c in EVERY if test(unicodedata.category(chr(c)), unicodedata.name(chr(c), ""))}


def test_the_default_ignorable_table_is_unicodes_definition() -> None:
    """DerivedCoreProperties.txt: Default_Ignorable_Code_Point = Other_Default_Ignorable_Code_Point
    + Cf + Variation_Selector - White_Space - FFF9..FFFB - 13430..1343F -
    Prepended_Concatenation_Mark. unicodedata has categories and names, not these properties:
    each part is checked through them, the exceptions and the reserved ones as Unicode 14.0
    lists them."""
    formats = _where(lambda category, _: category == "Cf")
    prepended = {*range(0x0600, 0x0606), 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD}
    exceptions = prepended | set(range(0xFFF9, 0xFFFC)) | set(range(0x13430, 0x13440))
    assert formats - IGNORABLE == exceptions & formats
    assert not IGNORABLE & exceptions
    selectors = _where(lambda _, name: "VARIATION SELECTOR" in name)
    assert len(selectors) == 3 + 1 + 16 + 240  # 180B..180D, 180F, FE00..FE0F, E0100..E01EF
    assert selectors <= IGNORABLE
    assert not any(chr(c).isspace() for c in IGNORABLE)
    other = IGNORABLE - formats - selectors  # Other_Default_Ignorable_Code_Point
    assert other - _where(lambda category, _: category == "Cn") == _where(
        lambda _, name: (
            name == "COMBINING GRAPHEME JOINER"
            or ("HANGUL" in name and name.endswith(" FILLER"))
            or name.startswith("KHMER VOWEL INHERENT")
        )
    )
    assert other & _where(lambda category, _: category == "Cn") == {
        0x2065, *range(0xFFF0, 0xFFF9), 0xE0000, *range(0xE0002, 0xE0020),
        *range(0xE0080, 0xE0100), *range(0xE01F0, 0xE1000),
    }  # fmt: skip


def test_no_character_a_reader_drops_makes_dots_pass() -> None:
    """The class, not its instances: every default-ignorable code point, every mark (Mn, Mc,
    Me) and format character, after "..", between dots or alone, is refused; so is every
    character that NFKD makes dots, "+" or ASCII spaces."""
    dropped = IGNORABLE | _where(lambda category, _: category[0] == "M" or category == "Cf")
    blanks = {
        c
        for c in EVERY
        if c >= 0xA0 and not unicodedata.normalize("NFKD", chr(c)).replace(".", "").strip(" +")
    }
    assert {0x034F, 0x0307, 0x0903, 0x20DD, 0x3164, 0xFE0F, 0xE0100} <= dropped
    assert {0xFF0E, 0x2025, 0xFF0B, 0x3000} <= blanks
    for c in sorted(dropped | blanks):
        for segment in (f"..{chr(c)}", f".{chr(c)}.", chr(c)):
            with pytest.raises(ObjectError, match=re.escape(DOTS)):
                parse(f"s3://docs/{ORG}/{segment}/{OTHER}/secret.md")


# ------------------------------------------------------------------ the property

_IGNORED = dict.fromkeys(i for i in range(0x80, 0x110000) if unicodedata.category(chr(i)) == "Cf")
_INVISIBLE = dict.fromkeys([*IGNORABLE, *range(0x20), *range(0x7F, 0xA0)])


def _nfkc(path: str) -> str:
    return unicodedata.normalize("NFKC", path)


def _lookalikes(path: str) -> str:
    folded = _nfkc(path).translate(_IGNORED)
    for chars, to in (("\u3002", "."), ("\u2215\u2044\u29f8", "/"), ("\u2216\u29f9", "\\")):
        for char in chars:
            folded = folded.replace(char, to)
    return folded


def _invisible(path: str) -> str:
    """UTS #46 maps default-ignorable code points to nothing; "strip invisible" sanitisers
    drop controls too."""
    return path.translate(_INVISIBLE)


def _accents(path: str) -> str:
    """Accent folding: NFKD, combining marks dropped."""
    nfkd = unicodedata.normalize("NFKD", path)
    return "".join(c for c in nfkd if unicodedata.category(c) not in {"Mn", "Me"})


def _params(path: str) -> str:
    return "/".join(segment.split(";", 1)[0] for segment in path.split("/"))


def _query(path: str) -> str:
    """The key decoded and read again as a URL's path: a "?" or a "#" ends it."""
    return re.split("[?#]", path, maxsplit=1)[0]


def _trim(path: str) -> str:
    return "/".join(segment.strip() for segment in path.split("/"))


def _windows(path: str) -> str:
    return "/".join(s.rstrip(". ") for s in path.replace("\\", "/").split("/"))


def _merge_slashes(path: str) -> str:
    return re.sub("/+", "/", path)


def _rfc3986(path: str) -> str:
    """The key as an HTTP store resolves its request path (remove_dot_segments)."""
    return unquote(urlsplit(urljoin("http://store/docs/", quote(path, safe="/"))).path)[6:]


NORMALISERS: list[Callable[[str], str]] = [
    unquote,
    unquote_plus,  # a form's decoding: "+" is a space
    _nfkc,
    _lookalikes,
    _invisible,
    _accents,
    _params,
    _query,
    _trim,
    _windows,
    _merge_slashes,
    _rfc3986,
    posixpath.normpath,
]
PIECES = [
    "/", ".", "..", "...", " ", ";", "+", "%", "%2e", "%2E", "%2f", "%25", "%252e", "%5c",
    "%u002e", "%2b", "%3f", "%23", "\\", "\uff0e", "\u2024", "\u2025", "\u3002", "\uff61",
    "\uff0f", "\u2215", "\uff3c", "\uff0b", "\uff1f", "\uff03", "\uff12", "\u3000", "\u200b",
    "\u00ad", "\u2060", "\u034f", "\ufe0f", "\U000e0100", "\U000e0041", "\u3164", "\u115f",
    "\uffa0", "\u17b4", "\u180b", "\u0307", "\u0301", "\u20dd", "%c0%ae", "%EF%BC%8E", "a",
    "b.md", "\u00e9",
]  # fmt: skip


@settings(max_examples=1000)
@given(tail=st.lists(st.sampled_from(PIECES) | st.text(max_size=2), max_size=10).map("".join))
@example(tail="a/b.md")
@example(tail="..")
@example(tail=f"..\u034f/{OTHER}/secret.md")  # the second attacker's keys
@example(tail=f"..\ufe0f/{OTHER}/secret.md")
@example(tail=f"..\u3164/{OTHER}/secret.md")
@example(tail=f".\u0307./{OTHER}/secret.md")
@example(tail=f"..+/{OTHER}/secret.md")
@example(tail=f"%\uff12e%\uff12e/{OTHER}/secret.md")
@example(tail=f"..\uff1f/{OTHER}/secret.md")
@example(tail=f"..\x80/{OTHER}/secret.md")
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
