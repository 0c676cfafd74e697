"""``schemas.wire``: what a consumer accepts as JSON, and the record shapes that used to stall a
partition (issue 7, defect 1). Every refusal is a ``WireError``, never another exception."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.wire import MAX_DEPTH, MAX_WIDTH, WireError, address_of, decode

ENVELOPE = {"correlation_id": "c-1", "reply_to": "replies.a", "request": {}, "policy": {}}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (b"", "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"{oops", "not_json"),
        (b"NaN", "not_json"),
        (b"[Infinity]", "not_json"),
        (b"[1e999]", "number_range"),
        (b"[" + b"9" * 4_301 + b"]", "number_range"),
        (b"[9223372036854775808]", "number_range"),
        (b"[-9223372036854775809]", "number_range"),
        (nested(1_000).encode(), "too_deep"),
        (nested(MAX_DEPTH + 1).encode(), "too_deep"),
        (b'{"a": "\\ud800"}', "lone_surrogate"),
        (b'{"\\udfff": 1}', "lone_surrogate"),
        (b'["ok", ["\\ud83d"]]', "lone_surrogate"),
    ],
)
def test_what_cannot_be_validated_or_echoed_is_refused(value: bytes, cause: str) -> None:
    with pytest.raises(WireError) as raised:
        decode(value)
    assert raised.value.cause == cause


def test_what_is_ordinary_json_is_accepted() -> None:
    assert decode(nested(MAX_DEPTH).encode()) is not None
    assert decode(b'{"brackets in a string": "[[[[{{{{"}') == {"brackets in a string": "[[[[{{{{"}
    assert decode(b'["\\ud83d\\ude00", "\\u0000"]') == ["\U0001f600", "\x00"]  # a pair, a NUL
    assert decode(b"[-9223372036854775808, 9223372036854775807, 1.5e300]") == [
        -(2**63),
        2**63 - 1,
        1.5e300,
    ]


def test_an_address_is_still_read_when_the_rest_is_refused() -> None:
    huge = json.dumps({**ENVELOPE, "policy": {"total_token_budget": 0}}).replace(
        '"total_token_budget": 0', '"total_token_budget": ' + "9" * 5_000
    )
    assert address_of(huge.encode()) == ("replies.a", "c-1")
    surrogate = json.dumps({**ENVELOPE, "request": {"query": "\ud800"}})
    assert address_of(surrogate.encode()) == ("replies.a", "c-1")
    assert address_of(b"[" * 100_000) is None
    assert address_of(json.dumps({**ENVELOPE, "correlation_id": "\ud800"}).encode()) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2_000))
def test_random_bytes_are_decoded_or_refused_with_a_wire_error(value: bytes) -> None:
    with contextlib.suppress(WireError):
        decode(value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_what_decodes_can_always_be_encoded_again(value: object) -> None:
    """Whatever ``decode`` accepts serialises back to UTF-8 JSON: a reply quoting it can go."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        decoded = decode(text.encode("utf-8", "surrogatepass"))
    except WireError:
        return
    json.dumps(decoded, ensure_ascii=False).encode("utf-8")


def test_a_lenient_subtree_leaves_lone_surrogates_to_the_model() -> None:
    value = b'{"request": {"entities": [{"id": "\\ud800"}], "query": "ok"}}'
    assert decode(value, lenient=(("request", "entities"),))["request"]["query"] == "ok"
    with pytest.raises(WireError):
        decode(value)
    with pytest.raises(WireError):
        decode(
            b'{"request": {"entities": [], "query": "\\ud800"}}', lenient=(("request", "entities"),)
        )


def test_escaped_quotes_cannot_make_the_depth_count_slow() -> None:
    """An unterminated string of escaped quotes made the old pattern backtrack quadratically
    (an hour for 1 MB): the count is one linear scan now."""
    value = ("[" * 65 + '"' + '\\"' * 500_000).encode()
    with pytest.raises(WireError) as raised:
        decode(value)
    assert raised.value.cause == "too_deep"


@pytest.mark.parametrize(
    "value",
    [
        b"[" + b",".join([b"{}"] * (MAX_WIDTH + 1)) + b"]",
        b'{"a": [' + b",".join([b"1"] * (MAX_WIDTH + 1)) + b"]}",
        b"{" + b",".join(b'"k%d": 1' % i for i in range(MAX_WIDTH + 1)) + b"}",
    ],
    ids=["a list of objects", "a nested list", "an object's keys"],
)
def test_a_container_wider_than_the_limit_is_refused(value: bytes) -> None:
    """A validator records an error per unknown key or malformed entry: width is memory."""
    with pytest.raises(WireError) as refused:
        decode(value)
    assert refused.value.cause == "too_wide"


def test_a_container_at_the_limit_and_commas_in_strings_are_accepted() -> None:
    assert len(decode(b"[" + b",".join([b"1"] * MAX_WIDTH) + b"]")) == MAX_WIDTH
    assert decode(json.dumps(["," * 10_000, {"a": ", " * 5_000}]).encode())[0] == "," * 10_000
