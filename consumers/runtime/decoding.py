"""The first stage of every handler: bytes to a validated request, or what to do instead.

A record that is not JSON this service accepts, or does not validate, is answered on its own
``reply_to`` with its ``correlation_id`` when both are usable (the handler says how, through
``refuse``); without a usable address it can never be answered, and is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from consumers.runtime.records import DeadLetter, Reply
from schemas import wire
from schemas.envelope import printable, reply_address
from schemas.errors import validation_lines

T = TypeVar("T")

Refuse = Callable[[str, str, str, list[str]], Reply]

DEAD_LETTER_CAUSES = ("invalid", *wire.CAUSES)
"""The causes of the dead letters :func:`decode_request` makes (a record with no usable
address)."""
"""``(reply_to, correlation_id, message, details)`` -> the topic's own refusal reply."""


def decode_request(
    value: bytes | None,
    parse: Callable[[Any], T],
    what: str,
    refuse: Refuse,
    *,
    lenient: tuple[tuple[str, ...], ...] = (),
) -> T | Reply | DeadLetter:
    """``parse`` of the decoded ``value``; or ``refuse``'s reply; or a dead letter.

    ``what`` names the record in messages ("build request", "upload", …); ``lenient`` is passed
    to :func:`schemas.wire.decode`.
    """
    try:
        data = wire.decode(value, lenient=lenient)
    except wire.WireError as error:
        address = wire.address_of(value)
        if address is None:
            return DeadLetter(error.cause, str(error))
        return refuse(*address, f"the {what} is not JSON this service accepts", [str(error)])
    try:
        return parse(data)
    except ValidationError as error:
        lines = [printable(line) for line in validation_lines(error)]
        address = reply_address(data)
        if address is None:
            return DeadLetter(
                "invalid",
                f"invalid {what} without a usable reply_to/correlation_id: "
                + "; ".join(lines)[:2_000],
            )
        return refuse(*address, f"the {what} is invalid", lines)
