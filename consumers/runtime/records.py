"""What a handler receives and what it answers. Pure: no Kafka client here.

A handler turns an :class:`Inbound` record into one :data:`Outcome`:

* :class:`Reply`: publish this message on this topic (a reply, or an error reply);
* :class:`Done`: the effect is applied and nothing is to be published;
* :class:`DeadLetter`: the record can never be handled; park it with the reason;
* :class:`Retry`: a transient failure; try again later (bounded, then a dead letter).

Retry state travels in the record's own headers (docs/delivery.md): a retried record is
re-published to its topic with ``contextcore-attempt`` one higher and ``contextcore-not-before-ms``
set, so the count survives a restart and a rebalance, and no process keeps it in memory. Any
producer can set these headers, so they are read defensively: a first delivery never waits,
a wait is capped by the back-off of its attempt, and a first position must name this topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from pydantic import BaseModel

from schemas.envelope import printable

HEADER_ATTEMPT = "contextcore-attempt"
HEADER_NOT_BEFORE = "contextcore-not-before-ms"
HEADER_FIRST_POSITION = "contextcore-first-position"
HEADER_LAST_ERROR = "contextcore-last-error"
MAX_LAST_ERROR_CHARS = 500
"""A retried copy's last failure is cut to this many characters."""
RUNTIME_HEADERS = frozenset(
    {HEADER_ATTEMPT, HEADER_NOT_BEFORE, HEADER_FIRST_POSITION, HEADER_LAST_ERROR}
)

Headers = Sequence[tuple[str, bytes]]


def _header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key == name:
            try:
                return value.decode("ascii")
            except (UnicodeDecodeError, AttributeError):
                return None
    return None


def _natural(text: str | None) -> int | None:
    """A non-negative integer written in plain ASCII digits (at most 18), or ``None``."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


def _positive_int(text: str | None) -> int | None:
    value = _natural(text)
    return value if value else None


@dataclass(frozen=True, slots=True)
class Position:
    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @classmethod
    def parse(cls, text: str | None) -> Position | None:
        if text is None:
            return None
        topic, _, rest = text.rpartition("/")
        topic, _, partition = topic.rpartition("/")
        p, o = _natural(partition), _natural(rest)
        if not topic or p is None or o is None:
            return None
        return cls(topic, p, o)


@dataclass(frozen=True, slots=True)
class Inbound:
    """One record as the runtime received it. Headers a client set are kept as they came."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def position(self) -> Position:
        return Position(self.topic, self.partition, self.offset)

    @property
    def attempt(self) -> int:
        """1 for a first delivery; a retried record carries its attempt in a header."""
        return max(_positive_int(_header(self.headers, HEADER_ATTEMPT)) or 1, 1)

    @property
    def not_before_ms(self) -> int | None:
        """Wall-clock milliseconds before which a retried record is not handled again (never
        for a first delivery, whatever its headers say)."""
        if self.attempt == 1:
            return None
        return _positive_int(_header(self.headers, HEADER_NOT_BEFORE))

    @property
    def first_position(self) -> Position:
        """Where the record first arrived (a retry is re-published elsewhere in its topic); a
        header naming another topic is not believed."""
        first = Position.parse(_header(self.headers, HEADER_FIRST_POSITION))
        return first if first is not None and first.topic == self.topic else self.position

    def own_headers(self) -> list[tuple[str, bytes]]:
        """The client's headers, without the runtime's retry headers."""
        return [(k, v) for k, v in self.headers if k not in RUNTIME_HEADERS]


@dataclass(frozen=True, slots=True)
class Reply:
    """Publish ``message`` on ``topic`` with ``correlation_id``.

    ``fallback`` answers the same request when ``message`` cannot be serialised or the broker
    refuses it (too large): a small error reply, so the caller is told instead of waiting.
    """

    topic: str
    correlation_id: str
    message: BaseModel
    fallback: Callable[[str], BaseModel] | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The effect is applied; nothing to publish."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Park the record: ``cause`` is a short label (a metric label), ``reason`` the detail (the
    operator's: it may quote an exception). ``told`` is what the record's caller may hear of it,
    when the runtime tells it (a farewell): never an exception's text, which may hold a
    database's tables, values or addresses."""

    cause: str
    reason: str
    told: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A transient failure: handle the record again later, up to the attempt limit."""

    cause: str
    reason: str


Outcome = Reply | Done | DeadLetter | Retry


@dataclass
class Stopwatch:
    """Per-stage timings of one record (``decode``, ``build``, ``publish`` …), in seconds."""

    clock: Callable[[], float] = time.perf_counter
    laps: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = self.clock()
        try:
            yield
        finally:
            self.laps[name] = self.laps.get(name, 0.0) + self.clock() - started


def backoff_s(attempt: int, *, base_s: float, max_s: float) -> float:
    """The wait before attempt ``attempt + 1``: ``base_s`` doubling per attempt, capped."""
    return float(min(base_s * 2 ** min(max(attempt - 1, 0), 60), max_s))


def describe(error: BaseException) -> str:
    """An exception as a retry's or a letter's reason: its type and its first line, printable
    and bounded (the rest of a message may be a whole query)."""
    text = printable(str(error)).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first[:500]}" if first else type(error).__name__
