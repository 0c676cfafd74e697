"""Which topics a reply may go to: one rule, shared by the service and the clients. Pure.

A request names the topic of its answer (``reply_to``), and the service writes the answer there
with its own Kafka credential. Unchecked, that lets any producer make the service write into
any topic the service may write: a brief (a tenant's data) into another request topic, a forged
record into ``contextcore.embed`` or a dead-letter topic, anything into ``__consumer_offsets``.
So a reply topic must be one a caller may own. :meth:`ReplyTopics.refusal` refuses, in order:

1. a name that is not a Kafka topic name (``[A-Za-z0-9._-]``, 1 to 249 characters, not ``.`` or
   ``..``; the envelope refuses those already);
2. Kafka's internal topics: any name starting ``__`` (``__consumer_offsets``,
   ``__transaction_state``, …);
3. the service's own topics: the build-request, upload, memory-write and embedding topics;
4. every dead-letter topic: any name ending ``.dlt``;
5. a name the reply pattern does not match in full (``CONTEXTCORE_TOPIC_REPLY_PATTERN``; unset,
   the names under the clients' own prefix: ``<reply_prefix>.`` and at least one character).

Rules 2 to 4 win over the pattern: a pattern of ``.*`` still refuses them. The clients name their
reply topic ``<reply_prefix>.<client id>`` (:func:`client_reply_topic`) and check it against the
same rule before they send anything, so a client never asks for a reply the service refuses; the
service checks each request's ``reply_to`` when it reads the request and each reply's topic again
when it publishes it (docs/topics.md, "Reply topics"). In a cluster with ACLs, the service's
principal may write the reply prefix and its own topics only (docs/operations.md, "Kafka ACLs").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.envelope import printable
from schemas.errors import ConfigurationError

if TYPE_CHECKING:
    from broker.settings import TopicSettings

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""A Kafka topic name (fullmatch: a trailing newline is no topic name, whatever ``$`` says)."""
INTERNAL_PREFIX = "__"
DEAD_LETTER_SUFFIX = ".dlt"
CLIENT_ID_EXAMPLE = "3f2a6c1e9b0d4e7fa8c5d2b1e0f9a7c6"
"""A client id as :class:`~producers.client.ReplyChannel` makes them (``uuid4().hex``): a reply
pattern must admit ``<reply_prefix>.<this>``, or no client could ever be answered."""


def is_topic_name(name: str) -> bool:
    """Whether ``name`` is a Kafka topic name (the envelope's ``TopicName``)."""
    return name not in (".", "..") and _TOPIC_NAME.fullmatch(name) is not None


def client_reply_topic(prefix: str, client_id: str) -> str:
    """The reply topic a client of ``client_id`` creates, reads and deletes."""
    return f"{prefix}.{client_id}"


def default_pattern(prefix: str) -> str:
    """The names under ``prefix``: ``<prefix>.`` then one or more topic-name characters."""
    return re.escape(prefix) + r"\.[A-Za-z0-9._-]+"


@dataclass(frozen=True)
class ReplyTopics:
    """The rule; build it with :meth:`of`, which refuses a configuration no client can use."""

    pattern: re.Pattern[str]
    """Matched in full against every name the explicit refusals left."""
    own: frozenset[str]
    """The service's request and internal topics."""

    @classmethod
    def of(cls, topics: TopicSettings) -> ReplyTopics:
        """The rule of ``topics`` (its own topic names, its reply prefix and pattern).

        Raises:
            ConfigurationError: the pattern is not a regular expression, or the rule would
                refuse the clients' own reply topics (``<reply_prefix>.<client id>``).
        """
        source = topics.reply_pattern
        if source is None:
            source = default_pattern(topics.reply_prefix)
        try:
            pattern = re.compile(source)
        except re.error as error:
            raise ConfigurationError(
                f"CONTEXTCORE_TOPIC_REPLY_PATTERN {printable(source)[:200]!r} is not a regular "
                f"expression: {error}"
            ) from None
        own = (topics.build_request, topics.upload, topics.memory_write, topics.embed)
        rule = cls(pattern, frozenset(own))
        example = client_reply_topic(topics.reply_prefix, CLIENT_ID_EXAMPLE)
        refused = rule.refusal(example)
        if refused is not None:
            raise ConfigurationError(
                "the reply-topic rule refuses the clients' own reply topics "
                f"(CONTEXTCORE_TOPIC_REPLY_PREFIX {printable(topics.reply_prefix)[:200]!r}, "
                f"then '.<client id>'): {refused}"
            )
        return rule

    def refusal(self, topic: str) -> str | None:
        """Why no reply may go to ``topic`` (the name and the rule it breaks); ``None`` when
        one may."""
        shown = repr(printable(topic)[:260])
        if not is_topic_name(topic):
            return f"{shown} is not a Kafka topic name"
        if topic.startswith(INTERNAL_PREFIX):
            return f"{shown} is internal to Kafka (a name starting {INTERNAL_PREFIX!r})"
        if topic in self.own:
            return f"{shown} is one of the service's own topics"
        if topic.endswith(DEAD_LETTER_SUFFIX):
            return f"{shown} is a dead-letter topic (a name ending {DEAD_LETTER_SUFFIX!r})"
        if not self.pattern.fullmatch(topic):
            return (
                f"{shown} is not a reply topic: it must match {self.pattern.pattern!r} in full "
                "(CONTEXTCORE_TOPIC_REPLY_PATTERN; by default the names under the reply prefix)"
            )
        return None

    def allows(self, topic: str) -> bool:
        return self.refusal(topic) is None
