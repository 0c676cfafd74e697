"""Dead-letter records that always fit. Pure.

A dead letter names where the record came from, why it was parked and after how many attempts,
and keeps as much of the payload as fits: at most ``payload_limit`` bytes of it, decoded as
UTF-8 with replacement characters, with the original size and sha256 so the whole record can be
found and compared. The serialised letter is kept under the broker's record limit whatever the
payload holds (escaping can make JSON six times larger than its text).
"""

from __future__ import annotations

import hashlib

from consumers.runtime.records import Inbound
from schemas.envelope import DeadLetterV1, printable

MAX_REASON_CHARS = 2_000
HEADER_CONTENT_TYPE = "content-type"
HEADER_ORIGINAL_TOPIC = "x-original-topic"
HEADER_ORIGINAL_PARTITION = "x-original-partition"
HEADER_ORIGINAL_OFFSET = "x-original-offset"
HEADER_CAUSE = "x-dead-letter-cause"


def _cut(data: bytes, limit: int) -> str:
    """At most ``limit`` bytes of ``data`` as text (a split character becomes U+FFFD)."""
    return data[:limit].decode("utf-8", errors="replace")


def dead_letter(
    record: Inbound,
    *,
    cause: str,
    reason: str,
    consumer_group: str,
    payload_limit: int,
    max_bytes: int,
    minimal: bool = False,
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The dead letter of ``record`` as (value, headers), serialised under ``max_bytes``.

    Every field is bounded: the payload (then halved until the letter fits), the key (1 KiB),
    the reason (2,000 characters), and the origin (a topic name and two numbers; a first
    position is only believed when it names this record's topic). ``minimal`` drops the payload
    and the key: the letter of last resort when the broker refused the full one for good.
    """
    value = record.value or b""
    digest = hashlib.sha256(value).hexdigest()
    first = record.first_position
    limit = 0 if minimal else min(payload_limit, len(value))
    while True:
        letter = DeadLetterV1(
            topic=first.topic,
            partition=first.partition,
            offset=first.offset,
            consumer_group=consumer_group,
            cause=cause,
            reason=printable(reason)[:MAX_REASON_CHARS],
            attempts=record.attempt,
            key=None if record.key is None or minimal else printable(_cut(record.key, 1024)),
            payload=printable(_cut(value, limit)),
            payload_bytes=len(value),
            payload_sha256=digest,
            payload_truncated=limit < len(value),
        )
        body = letter.model_dump_json().encode()
        if len(body) <= max_bytes or limit == 0:
            break
        limit //= 2  # escaped control characters: keep less until it fits
    headers = [
        (HEADER_CONTENT_TYPE, b"application/json"),
        (HEADER_ORIGINAL_TOPIC, first.topic.encode()),
        (HEADER_ORIGINAL_PARTITION, str(first.partition).encode()),
        (HEADER_ORIGINAL_OFFSET, str(first.offset).encode()),
        (HEADER_CAUSE, cause.encode()),
    ]
    return body, headers
