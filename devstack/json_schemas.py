"""JSON Schemas (draft 2020-12) of every message on every topic, generated from the pydantic
models of ``schemas/``, one file per message in ``docs/schemas/``.

    python -m devstack.json_schemas          write docs/schemas/<message>.schema.json
    python -m devstack.json_schemas --check  exit 1 when a committed file no longer matches

CI runs the check (``tests/unit/test_json_schemas.py``): a service in any language validates
what it sends and what it is answered against these files. A message the service *reads* is
the model's validation schema (what it accepts); one it *sends* is the serialization schema
(what it writes). Each file stands alone: the types it nests are under its ``$defs``, and its
``$id`` is its own file name, so it resolves inside the folder wherever the folder is served
from. Kafka headers are bytes; their schemas describe them as an object of UTF-8 strings by
header name.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from broker import lanes, tracing
from consumers.runtime import letters, records
from schemas.build import BuildReplyV1, BuildRequestV1
from schemas.envelope import DeadLetterV1
from schemas.memory import ForgetV1, MemoryAnswerV1, RememberV1
from schemas.upload import EmbedBatchV1, ReingestRequestV1, UploadRequestV1, UploadStatusV1

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class Message:
    """One message: its file's stem, what carries it, and its model (read: the service
    validates it; sent: the service writes it)."""

    name: str
    description: str
    model: type[BaseModel]
    direction: Literal["read", "sent"]

    def schema(self) -> dict[str, Any]:
        mode: JsonSchemaMode = "validation" if self.direction == "read" else "serialization"
        body = self.model.model_json_schema(mode=mode)
        return {
            "$schema": DRAFT,
            "$id": f"{self.name}.schema.json",
            **body,
            "$comment": (
                f"{self.description} Generated from schemas/ by python -m devstack.json_schemas."
            ),
        }


MESSAGES = (
    Message(
        "build-request",
        "contextcore.build-request: a request for one brief.",
        BuildRequestV1,
        "read",
    ),
    Message(
        "build-reply",
        "On the request's reply_to: a brief, an error or reuse_previous.",
        BuildReplyV1,
        "sent",
    ),
    Message("upload-request", "contextcore.upload: an admin's document.", UploadRequestV1, "read"),
    Message(
        "reingest-request",
        "contextcore.upload: ingest a stored source again (admin commands).",
        ReingestRequestV1,
        "read",
    ),
    Message(
        "upload-status",
        "On the upload's reply_to: pending, ready, failed, rejected or superseded.",
        UploadStatusV1,
        "sent",
    ),
    Message(
        "embed-batch",
        "contextcore.embed (internal): chunks to embed under one model.",
        EmbedBatchV1,
        "read",
    ),
    Message("memory-remember", "contextcore.memory-write: memory.remember.", RememberV1, "read"),
    Message("memory-forget", "contextcore.memory-write: memory.forget.", ForgetV1, "read"),
    Message("memory-answer", "On the call's reply_to: written or refused.", MemoryAnswerV1, "sent"),
    Message("dead-letter", "<topic>.dlt: a record no reply could answer.", DeadLetterV1, "sent"),
)


def _headers(
    name: str, description: str, headers: dict[str, dict[str, Any]], required: list[str]
) -> dict[str, Any]:
    return {
        "$schema": DRAFT,
        "$id": f"{name}.schema.json",
        "title": name,
        "description": description,
        "type": "object",
        "properties": {header: {"type": "string", **schema} for header, schema in headers.items()},
        "required": required,
        "additionalProperties": {"type": "string"},
        "$comment": "Kafka headers by name, their values as UTF-8 text. Generated from "
        "devstack/json_schemas.py by python -m devstack.json_schemas.",
    }


# The header names come from the code that writes them; each schema is the name's description
# and, where the code bounds the value, its length.
UUID_PATTERN = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
DEAD_LETTER_HEADERS: dict[str, dict[str, Any]] = {
    letters.HEADER_CONTENT_TYPE: {"const": "application/json"},
    letters.HEADER_ORIGINAL_TOPIC: {"description": "the topic the record first arrived on"},
    letters.HEADER_ORIGINAL_PARTITION: {"description": "its partition, in decimal"},
    letters.HEADER_ORIGINAL_OFFSET: {"description": "its offset there, in decimal"},
    letters.HEADER_CAUSE: {"description": "the letter's cause (DeadLetterV1.cause)"},
}
RETRY_HEADERS: dict[str, dict[str, Any]] = {
    records.HEADER_ATTEMPT: {"description": "the attempt this copy is (2, 3, ...), in decimal"},
    records.HEADER_NOT_BEFORE: {
        "description": "wall-clock milliseconds before which it is not handled again"
    },
    records.HEADER_FIRST_POSITION: {"description": "topic/partition/offset of the first delivery"},
    records.HEADER_LAST_ERROR: {
        "description": "the last failure",
        "maxLength": records.MAX_LAST_ERROR_CHARS,
    },
}
REQUEST_HEADERS: dict[str, dict[str, Any]] = {
    lanes.HEADER_ORGANIZATION: {
        "description": "the organization a request is for (its UUID, or "
        f"'{lanes.PLATFORM}'): the consumer serves organizations in turn by it; it grants "
        "nothing, the value names the organization",
        "pattern": f"^({lanes.PLATFORM}|{UUID_PATTERN})$",
    },
    "traceparent": {
        "description": "W3C trace context (optional): the request's span joins the caller's "
        "trace; a longer value is ignored",
        "maxLength": tracing.MAX_TRACE_HEADER,
    },
    "tracestate": {
        "description": "W3C trace state (optional); a longer value is ignored",
        "maxLength": tracing.MAX_TRACE_HEADER,
    },
}


def documents() -> dict[str, str]:
    """``{file name: JSON}`` of every message and header set, keys sorted."""
    found = {f"{m.name}.schema.json": m.schema() for m in MESSAGES}
    found["dead-letter-headers.schema.json"] = _headers(
        "dead-letter-headers",
        "The headers of a record on <topic>.dlt.",
        DEAD_LETTER_HEADERS,
        list(DEAD_LETTER_HEADERS),
    )
    found["retry-headers.schema.json"] = _headers(
        "retry-headers",
        "The headers a retried copy carries on its consumer's own topic, beside the client's "
        "(docs/topics.md); any producer may set them, and the runtime reads them defensively.",
        RETRY_HEADERS,
        [],
    )
    found["request-headers.schema.json"] = _headers(
        "request-headers",
        "The headers a client sets on a request (build, upload, memory write); all optional.",
        REQUEST_HEADERS,
        [],
    )
    return {name: json.dumps(body, indent=2, sort_keys=True) + "\n" for name, body in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.json_schemas", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    generated = documents()
    stale = [
        name
        for name, text in generated.items()
        if not (DOCS / name).exists() or (DOCS / name).read_text() != text
    ]
    extra = sorted(p.name for p in DOCS.glob("*.json") if p.name not in generated)
    if args.check:
        for name in [*stale, *extra]:
            print(
                f"docs/schemas/{name} does not match the code: run python -m devstack.json_schemas"
            )
        return 1 if stale or extra else 0
    DOCS.mkdir(parents=True, exist_ok=True)
    for name in extra:
        (DOCS / name).unlink()
    for name, text in generated.items():
        (DOCS / name).write_text(text)
    print(f"wrote {len(generated)} schemas to {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
