"""A consumer's log lines: each line about a record carries the record's correlation id and its
trace id, as JSON when the output is not a terminal (a log collector's), as text when it is.

The delivery runs each record in a task of its own and names the record there
(:func:`about_record`); a handler adds the correlation id once it has read it
(:func:`bind_correlation_id`). Both are context variables, so concurrent records never see each
other's; the trace id is the current span's (consumers/runtime/tracing.py).
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO

from opentelemetry import trace

_RECORD: ContextVar[object | None] = ContextVar("contextcore_record", default=None)
_CORRELATION_ID: ContextVar[str | None] = ContextVar("contextcore_correlation_id", default=None)


def about_record(position: object) -> None:
    """Name the record this task handles (its position, written as topic/partition/offset
    only when a line is logged)."""
    _RECORD.set(position)
    _CORRELATION_ID.set(None)


def bind_correlation_id(correlation_id: str) -> None:
    """The correlation id of the record this task handles, once a handler has read it."""
    _CORRELATION_ID.set(correlation_id)


class RecordFields(logging.Filter):
    """Adds ``record``, ``correlation_id`` and ``trace_id`` (each ``None`` when unknown) to
    every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        position = _RECORD.get()
        record.record = None if position is None else str(position)
        record.correlation_id = _CORRELATION_ID.get()
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else None
        return True


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the record's fields, and the
    traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in ("record", "correlation_id", "trace_id"):
            value = getattr(record, field, None)
            if value is not None:
                line[field] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class Text(logging.Formatter):
    """The text form for a terminal: the record's fields in brackets after the level."""

    def format(self, record: logging.LogRecord) -> str:
        fields = [
            f"{name}={value}"
            for name in ("correlation_id", "trace_id", "record")
            if (value := getattr(record, name, None)) is not None
        ]
        text = super().format(record)
        if not fields:
            return text
        head, _, rest = text.partition(": ")
        return f"{head} [{' '.join(fields)}]: {rest}"


def configure(level: int = logging.WARNING, stream: IO[str] | None = None) -> None:
    """The root logger's one handler: JSON lines unless ``stream`` (stderr) is a terminal."""
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.addFilter(RecordFields())
    if stream.isatty():
        handler.setFormatter(Text("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonLines())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
