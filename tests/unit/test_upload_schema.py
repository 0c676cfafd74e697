"""The upload's identity fits the unique index that holds it: bounded in UTF-8 bytes."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.upload import MAX_ADDRESS_BYTES, UploadRequestV1


def upload(**identity: Any) -> dict[str, Any]:
    return {
        "correlation_id": "c",
        "reply_to": "r",
        "scope": "platform",
        "title": "t",
        "media_type": "text/plain",
        "idempotency_key": "k",
    } | identity


def inline(path: str) -> dict[str, Any]:
    return upload(uri="docs://" + path, content={"text": "x"})


def in_object_store(path: str) -> dict[str, Any]:
    return upload(object="s3://b/" + path)


@pytest.mark.parametrize("message", [inline, in_object_store])
def test_an_address_is_bounded_in_bytes_not_characters(message: Any) -> None:
    """2,000 CJK characters are within 2,000 characters and 6,000 bytes: PostgreSQL's unique
    index of the identity refused them (issue 32). 500 emoji are 2,000 bytes and more."""
    room = MAX_ADDRESS_BYTES - len(message("")["uri" if message is inline else "object"])
    UploadRequestV1.model_validate(message("a" * room))
    UploadRequestV1.model_validate(message("\u4e2d" * (room // 3)))
    with pytest.raises(ValidationError, match="at most 2000 characters"):
        UploadRequestV1.model_validate(message("a" * (room + 1)))
    for over in ("\u4e2d" * (room // 3 + 1), "\U0001f600" * 500):
        with pytest.raises(ValidationError, match="bytes in UTF-8, over 2,000"):
            UploadRequestV1.model_validate(message(over))
