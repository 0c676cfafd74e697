"""The first stage of every handler: bytes to a validated request, or what to do instead.

A record that is not JSON this service accepts, or does not validate, is answered on its own
``reply_to`` with its ``correlation_id`` when both are usable (the handler says how, through
``refuse``); without a usable address it can never be answered, and is dead-lettered.

A ``reply_to`` the reply-topic rule refuses (:mod:`broker.reply_topics`: Kafka's internal
topics, the service's own, a dead-letter topic, a name outside the reply pattern) is never
answered, valid request or not: the record is dead-lettered (``reply_to_refused``) before its
handler does anything with it, the reason naming the topic and the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from broker.reply_topics import ReplyTopics, is_topic_name
from consumers.runtime.records import DeadLetter, Reply
from schemas import wire
from schemas.envelope import printable, reply_address
from schemas.errors import validation_lines

T = TypeVar("T")

Refuse = Callable[[str, str, str, list[str], object], Reply]
"""``(reply_to, correlation_id, message, details, data)`` -> the topic's own refusal reply;
``data`` is the record's decoded JSON (``None`` when it was not JSON), so a handler that wants
more of a refused record than its address reads it without decoding it again."""

REPLY_TO_REFUSED = "reply_to_refused"
DEAD_LETTER_CAUSES = ("invalid", *wire.CAUSES, REPLY_TO_REFUSED)
"""The causes of the dead letters :func:`decode_request` makes (a record with no usable
address, or with a reply topic the rule refuses)."""


def decode_request(
    value: bytes | None,
    parse: Callable[[Any], T],
    what: str,
    refuse: Refuse,
    *,
    reply_topics: ReplyTopics,
    lenient: tuple[tuple[str, ...], ...] = (),
) -> T | Reply | DeadLetter:
    """``parse`` of the decoded ``value``; or ``refuse``'s reply; or a dead letter.

    ``what`` names the record in messages ("build request", "upload", …); ``reply_topics`` is
    the rule every ``reply_to`` must pass, checked before anything else reads the request;
    ``lenient`` is passed to :func:`schemas.wire.decode`.
    """
    try:
        data = wire.decode(value, lenient=lenient)
    except wire.WireError as error:
        address = wire.address_of(value)
        if address is None:
            return DeadLetter(error.cause, str(error))
        refused = reply_topics.refusal(address[0])
        if refused is not None:
            return _refused(what, f"{refused}; and it is not JSON this service accepts: {error}")
        return refuse(*address, f"the {what} is not JSON this service accepts", [str(error)], None)
    refused = _refused_reply_to(data, reply_topics)
    if refused is not None:
        return _refused(what, refused)
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
        return refuse(*address, f"the {what} is invalid", lines, data)


def _refused_reply_to(data: Any, reply_topics: ReplyTopics) -> str | None:
    """Why the rule refuses the ``reply_to`` that ``data`` names, when it names a topic.

    Read before validation, so an invalid request is not answered there either. A ``reply_to``
    that is no topic name at all is left to validation: it is no usable address, and such a
    record is dead-lettered as ``invalid`` without any reply.
    """
    if not isinstance(data, dict):
        return None
    topic = data.get("reply_to")
    if not isinstance(topic, str) or not is_topic_name(topic):
        return None
    return reply_topics.refusal(topic)


def _refused(what: str, reason: str) -> DeadLetter:
    return DeadLetter(REPLY_TO_REFUSED, f"the {what}'s reply_to is refused: {reason}")
