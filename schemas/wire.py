"""Turning a record's bytes into JSON values a consumer can safely validate and echo. Pure.

The standard library's decoder accepts input that breaks a consumer later: an integer of
thousands of digits (``int`` refuses to print it), nesting deep enough to exhaust the
recursion limit of a validator or a serialiser, ``NaN`` and ``Infinity``, and lone UTF-16
surrogates (``"\\ud800"``), which decode into a ``str`` that UTF-8 cannot encode, so a reply
quoting them cannot be published. :func:`decode` refuses all of them with one
:class:`WireError` that says what and where, so the caller can answer instead of crashing.

Limits (RFC 7493, I-JSON, in spirit): UTF-8 text, at most :data:`MAX_DEPTH` levels, at most
:data:`MAX_WIDTH` members in an object or an array, integers within ±2**63, finite numbers, no
lone surrogate in a key or a string. The width bounds what validation makes of a record: a
validator records an error per unknown key or malformed entry, and one megabyte of ``{}`` is
350,000 of them (a build request of those took its consumer past a gigabyte).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from schemas.envelope import has_lone_surrogate, reply_address
from schemas.errors import ContextcoreError

MAX_DEPTH = 64
MAX_WIDTH = 4_096
"""Members of one object or array at most (every list a contract holds is bounded far below)."""
MAX_INT = 2**63

# A string (an unterminated one runs to the end) or a bracket: one linear scan, no backtracking
# (an earlier pattern that had to find a closing quote was quadratic on escaped quotes).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)
# Only a \uD800-\uDFFF escape can put a surrogate into a decoded string (the text itself is
# strict UTF-8), so the walk that finds lone ones runs only when such an escape is present.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


CAUSES = ("not_json", "number_range", "too_deep", "too_wide", "lone_surrogate")
"""Every :attr:`WireError.cause` (a dead letter's cause when the record names no reply)."""


class WireError(ContextcoreError, ValueError):
    """The record is not JSON this service accepts. ``cause`` is one of :data:`CAUSES`."""

    def __init__(self, cause: str, message: str) -> None:
        self.cause = cause
        super().__init__(message)


def _refuse_constant(name: str) -> Any:
    raise WireError("not_json", f"{name} is not a JSON number")


def _integer(text: str) -> int:
    value = int(text) if len(text) <= 20 else MAX_INT  # never int() of thousands of digits
    if not -MAX_INT <= value < MAX_INT:
        raise WireError("number_range", f"the integer {text[:24]}… is out of range")
    return value


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError("number_range", f"the number {text[:24]} is not finite")
    return value


def _path(parts: list[str | int]) -> str:
    joined = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    return joined.lstrip(".") or "<root>"


def decode(value: bytes | None, *, lenient: tuple[tuple[str, ...], ...] = ()) -> Any:
    """The JSON value of ``value``.

    ``lenient`` names subtrees where a lone surrogate is left for the message model to refuse
    element by element (``("request", "entities")``: a malformed ref is dropped, not the
    request).

    Raises:
        WireError: not UTF-8, not JSON, too deep, a number out of range, or a lone surrogate.
    """
    if not value:
        raise WireError("not_json", "the record has no value")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise WireError("not_json", f"not UTF-8 at byte {error.start}") from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        depth = _max_depth(text)
        if depth > MAX_DEPTH:
            raise WireError("too_deep", f"nested {depth} levels deep; the limit is {MAX_DEPTH}")
    try:
        data = json.loads(
            text, parse_constant=_refuse_constant, parse_int=_integer, parse_float=_number
        )
    except WireError:
        raise
    except (ValueError, RecursionError) as error:
        # JSONDecodeError, and int() refusing more than 4,300 digits
        raise WireError("not_json", f"not JSON: {str(error)[:200]}") from None
    if text.count(",") >= MAX_WIDTH:  # else no container can hold that many members
        _widest(data)
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        _lone_surrogates(data, lenient)
    return data


def _widest(data: Any) -> None:
    """Walk the decoded value (iteratively) and refuse a container of over :data:`MAX_WIDTH`
    members."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict | list) and len(node) > MAX_WIDTH:
            raise WireError(
                "too_wide", f"{_path(path)} holds {len(node)} members; the limit is {MAX_WIDTH}"
            )
        if isinstance(node, dict):
            stack.extend((child, [*path, key]) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(node))


def _max_depth(text: str) -> int:
    """The deepest bracket nesting of ``text``, ignoring brackets inside strings.

    Counted before parsing, so no parser or validator ever recurses into a deep document.
    """
    depth = deepest = 0
    for token in _TOKEN.findall(text):
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


def _lone_surrogates(data: Any, lenient: tuple[tuple[str, ...], ...]) -> None:
    """Walk the decoded value (iteratively) and refuse a key or string with a lone surrogate."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if any(tuple(path[: len(prefix)]) == prefix for prefix in lenient):
            continue
        if isinstance(node, dict):
            for key, child in node.items():
                if has_lone_surrogate(key):
                    raise WireError(
                        "lone_surrogate", f"a key at {_path(path)} holds a lone surrogate"
                    )
                stack.append((child, [*path, key]))
        elif isinstance(node, list):
            stack.extend((child, [*path, index]) for index, child in enumerate(node))
        elif isinstance(node, str) and has_lone_surrogate(node):
            raise WireError("lone_surrogate", f"{_path(path)} holds a lone surrogate")


def address_of(value: bytes | None) -> tuple[str, str] | None:
    """The reply address of a record :func:`decode` refused, when it can still be read.

    A lenient second look (numbers become 0) on the error path only: an out-of-range number or
    a lone surrogate elsewhere does not stop the sender from being told why.
    """
    try:
        data = json.loads(
            (value or b"").decode("utf-8"),
            parse_int=lambda _: 0,
            parse_float=lambda _: 0.0,
            parse_constant=lambda _: 0.0,
        )
    except (ValueError, RecursionError):
        return None
    return reply_address(data)
