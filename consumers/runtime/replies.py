"""A handler's reply, published; or its fallback; or why neither can be (docs/delivery.md, step 4).

A reply to a topic the reply-topic rule refuses (:mod:`broker.reply_topics`) is never published:
the record is dead-lettered (``reply_to_refused``). The rule is checked again for every reply,
farewells included: a handler's address may come from a row stored before the rule, or under
other settings. A reply that cannot be serialised, or that the broker refuses for good (too
large, bad topic), is replaced by the handler's fallback error reply, so the caller is told
instead of waiting; failing that, the record is dead-lettered (``reply_refused``). A publish the
broker may accept later (retriable) becomes a :class:`~consumers.runtime.records.Retry`.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

from broker.reply_topics import ReplyTopics
from broker.tracing import trace_headers
from consumers.runtime.decoding import REPLY_TO_REFUSED
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import DeadLetter, Outcome, Reply, Retry, Stopwatch, describe
from consumers.runtime.transport import Publisher, PublishError
from schemas.envelope import printable

log = logging.getLogger("contextcore.delivery")

REPLY_REFUSED = "reply_refused"
DEAD_LETTER_CAUSES = (REPLY_REFUSED, REPLY_TO_REFUSED)
"""The dead letters of a reply that did not go out."""


class Replies:
    def __init__(
        self,
        *,
        consumer: str,
        publisher: Publisher,
        metrics: RuntimeMetrics,
        reply_topics: ReplyTopics,
        max_record_bytes: int,
    ) -> None:
        self.consumer = consumer
        self.publisher = publisher
        self.reply_topics = reply_topics
        self.max_record_bytes = max_record_bytes
        self._failures = metrics.publish_failures.labels(consumer, "reply")

    async def publish(self, reply: Reply, watch: Stopwatch) -> Outcome:
        """Publish ``reply``, or its fallback when it cannot go out; the reply that went out, or
        what is left to do when neither did (a retry, a dead letter)."""
        refused = self.reply_topics.refusal(reply.topic)
        if refused is not None:
            return DeadLetter(REPLY_TO_REFUSED, f"the reply is not sent: {refused}")
        sent = await self.send(reply, reply.message, watch)
        if sent is None:
            return reply
        if isinstance(sent, Retry):
            return sent
        refused = f"the reply to {reply.topic!r} cannot be sent: {sent}"
        if reply.fallback is None:
            return DeadLetter(REPLY_REFUSED, refused)
        fallback = reply.fallback(printable(refused))
        sent = await self.send(reply, fallback, Stopwatch())
        if isinstance(sent, Retry):
            return sent
        if sent is not None:
            return DeadLetter(REPLY_REFUSED, f"{refused}; its error reply too: {sent}")
        log.warning("%s: sent an error reply instead: %s", self.consumer, printable(refused)[:300])
        return Reply(reply.topic, reply.correlation_id, fallback)

    async def farewell(self, farewell: Reply) -> bool:
        """Publish a farewell once, if the rule allows its topic: whether it went out. Nothing
        waits on it: the record's dead letter is already out."""
        refused = self.reply_topics.refusal(farewell.topic)
        if refused is not None:
            log.warning("%s: no farewell: %s", self.consumer, refused)
            return False
        if await self.send(farewell, farewell.message, Stopwatch()) is not None:
            log.warning("%s: the farewell to %s was not sent", self.consumer, farewell.topic)
            return False
        return True

    async def send(self, reply: Reply, message: BaseModel, watch: Stopwatch) -> Retry | str | None:
        """Serialise ``message`` and publish it to ``reply``'s topic: ``None`` once published,
        a :class:`Retry` when the broker may take it later, or why it never will."""
        with watch.stage("serialise"):
            body, problem = self._serialise(message)
        if body is None:
            return problem
        try:
            with watch.stage("publish"):
                await self.publisher.publish(
                    reply.topic,
                    body,
                    key=None,
                    headers=[
                        ("content-type", b"application/json"),
                        ("correlation_id", reply.correlation_id.encode()),
                        *trace_headers(),  # the record's span: the caller's trace continues
                    ],
                )
        except PublishError as error:
            self._failures.inc()
            if error.retriable:
                return Retry("reply_publish", f"the reply to {reply.topic!r} failed: {error}")
            return f"the broker refused it: {error}"
        return None

    def _serialise(self, message: BaseModel) -> tuple[bytes | None, str]:
        try:
            body = message.model_dump_json().encode()
        except Exception as error:  # a value JSON cannot carry (a lone surrogate, …)
            return None, f"it could not be serialised ({describe(error)})"
        if len(body) > self.max_record_bytes:
            return None, f"it is {len(body)} bytes, over the {self.max_record_bytes}-byte limit"
        return body, ""
