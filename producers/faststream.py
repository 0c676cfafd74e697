"""Briefs for a FastStream app, on the app's own broker connection.

Installed with the ``faststream`` extra: ``pip install contextcore-client[faststream]``.

A service that runs on FastStream requests a brief from one of its handlers without a
second Kafka connection: :class:`ContextBriefs` registers, on the app's :class:`KafkaBroker`,
a publisher of the build-request topic and a subscriber of this app's own reply topic
(``<reply_prefix>.<client id>``, one partition, read from its start), and matches replies to
requests with the same :class:`~producers.client.BuildCalls` as
:class:`~producers.client.ContextClient`: a new unguessable correlation id per request, the
wait bounded from the broker's acknowledgement, late, duplicate and foreign replies ignored,
an error reply raised as :class:`~producers.client.BuildFailed`::

    broker = KafkaBroker("localhost:9092")
    briefs = ContextBriefs(broker)
    app = FastStream(broker, after_startup=[briefs.start], after_shutdown=[briefs.close])

    @broker.subscriber("questions", group_id="answerer")
    async def answer(question: Question) -> None:
        brief = await briefs.build(question.request, POLICY)

The hooks are the app's *after* ones on purpose. :meth:`ContextBriefs.start` runs once the
broker is connected: it makes sure the reply topic exists with one partition (FastStream's
auto-creation only logs a warning when it cannot) and fails the start loudly otherwise.
:meth:`ContextBriefs.close` runs once the broker stopped, that is after FastStream let the
app's handlers finish (its graceful timeout) with the reply subscriber still reading: it fails
the calls still waiting (:class:`~schemas.errors.ClientClosed`) and deletes the reply topic.
Under FastStream's ``TestKafkaBroker`` both ends run in memory: a handler standing in for the
service answers on the request's ``reply_to`` (docs/clients.md, "FastStream").
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

try:
    from faststream import AckPolicy
    from faststream.kafka import KafkaBroker, KafkaMessage, TopicPartition
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "producers.faststream needs FastStream: pip install 'contextcore-client[faststream]'"
    ) from missing

from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from producers.client import (
    BriefRequests,
    BuildCalls,
    Session,
    not_taken,
    own_reply_topic,
    request_headers,
)
from schemas.build import BuildReplyV1
from schemas.context import ContextPolicy, ContextRequest
from schemas.errors import ConfigurationError, InfrastructureUnavailable

log = logging.getLogger("contextcore.client.faststream")

__all__ = ["ContextBriefs"]


class ContextBriefs(BriefRequests):
    """Build requests from a FastStream app's handlers. Make it before the broker starts."""

    def __init__(
        self,
        broker: KafkaBroker,
        *,
        request_topic: str = "contextcore.build-request",
        reply_topic_prefix: str = "contextcore.reply",
        reply_topics: ReplyTopics | None = None,
        fetch_max_wait_ms: int = 100,
        send_timeout_s: float = 30.0,
        session: Session | None = None,
    ) -> None:
        """``reply_topics``: the service's reply-topic rule (unless given, the default rule of
        ``reply_topic_prefix``). ``fetch_max_wait_ms``: the reply subscriber's long poll (the
        dev broker holds each fetch to its full wait: docs/clients.md). ``send_timeout_s``:
        how long the broker has to take a request. ``session``: the positions of this caller's
        writes, shared with its other clients (read-your-writes, docs/scaling.md).

        Raises:
            ConfigurationError: the rule refuses the app's reply topic (the service would
                never answer on it).
        """
        if send_timeout_s <= 0:
            raise ValueError("send_timeout_s must be positive")
        if not isinstance(broker, KafkaBroker):  # a router's prefix would rename both topics
            raise ConfigurationError("ContextBriefs takes the app's KafkaBroker itself")
        if broker.running:  # FastStream starts no subscriber made later
            raise ConfigurationError("make ContextBriefs before the app's broker starts")
        self.broker = broker
        self.request_topic = request_topic
        self.reply_topic = own_reply_topic(reply_topic_prefix, uuid.uuid4().hex, reply_topics)
        self.session = session or Session()
        self._send_timeout_s = send_timeout_s
        self._calls = BuildCalls(self.reply_topic, self.session)
        self._started = False
        self._topic_made = False
        self._publisher = broker.publisher(
            request_topic,
            title=f"{request_topic}:BuildRequestV1",
            description="Build requests (contextcore docs/asyncapi/build.yaml).",
        )
        self._subscriber = broker.subscriber(
            partitions=[TopicPartition(self.reply_topic, 0)],
            auto_offset_reset="earliest",
            fetch_max_wait_ms=fetch_max_wait_ms,
            ack_policy=AckPolicy.ACK_FIRST,  # whatever the broker's: no group, nothing to commit
            title=f"{self.reply_topic}:BuildReplyV1",
            description="This app's replies from contextcore, matched by correlation id.",
        )
        self._subscriber(self._on_reply)

    @classmethod
    def from_settings(cls, broker: KafkaBroker, topics: TopicSettings) -> ContextBriefs:
        """With the topic names and reply rule the service's settings name."""
        return cls(
            broker,
            request_topic=topics.build_request,
            reply_topic_prefix=topics.reply_prefix,
            reply_topics=ReplyTopics.of(topics),
        )

    async def _on_reply(self, message: KafkaMessage) -> None:
        """Every record of the reply topic (FastStream's handler; never raises)."""
        self._calls.answer(message.body, getattr(message.raw_message, "offset", -1))

    async def request(
        self,
        request: ContextRequest,
        policy: ContextPolicy,
        *,
        timeout: float = 10.0,
        explain: bool = False,
        read_after: str | None = None,
    ) -> BuildReplyV1:
        """Publish one request on the app's broker and return its reply, brief or error, as
        the service sent it (``ContextClient.request``'s rules).

        Raises:
            ReplyTimeout: no reply within ``timeout`` seconds of the broker taking the request.
            PublishFailed: the broker did not take the request.
        """
        if not self._started:
            raise ConfigurationError(
                "ContextBriefs.start() was not called: give it to the app's after_startup"
            )
        envelope = self._calls.envelope(request, policy, explain=explain, read_after=read_after)
        headers = {
            name: value.decode() for name, value in request_headers(request.subject.organization_id)
        }

        async def send() -> None:
            try:
                async with asyncio.timeout(self._send_timeout_s):
                    await self._publisher.publish(
                        envelope.model_dump_json().encode(),
                        key=envelope.correlation_id.encode(),
                        headers=headers,
                        correlation_id=envelope.correlation_id,
                    )
            except (KafkaError, TimeoutError) as error:
                raise not_taken(self.request_topic, self._send_timeout_s, error) from error

        return await self._calls.call(envelope, send, timeout)

    async def start(self) -> None:
        """The app's ``after_startup``: the reply topic exists with one partition (made now if
        FastStream's auto-creation did not), so every reply reaches the subscriber.

        Raises:
            ConfigurationError: the broker is not running, or the reply topic has more than
                one partition.
            InfrastructureUnavailable: the topic could not be made.
        """
        if not self._subscriber.running:  # FastStream's test broker starts it too
            raise ConfigurationError("ContextBriefs.start() runs after the broker started")
        admin = self.broker.config.admin.admin_client
        if admin is not None:  # None: FastStream's test broker, or a consumer-only one
            await self._ensure_reply_topic(admin)
        self._started = True

    async def _ensure_reply_topic(self, admin: AIOKafkaAdminClient) -> None:
        try:
            [described] = await admin.describe_topics([self.reply_topic])
            if described.get("error_code"):  # unknown: FastStream could not make it
                await admin.create_topics([NewTopic(self.reply_topic, 1, 1)])
                [described] = await admin.describe_topics([self.reply_topic])
        except KafkaError as error:
            raise InfrastructureUnavailable(
                f"the reply topic {self.reply_topic} could not be made: {error}"
            ) from error
        partitions = len(described.get("partitions") or ())
        if partitions != 1:
            raise ConfigurationError(
                f"the reply topic {self.reply_topic} has {partitions} partitions, not one"
            )
        self._topic_made = True

    async def close(self) -> None:
        """The app's ``after_shutdown``: fail the calls still waiting, then delete the reply
        topic (best effort, through an admin client of the broker's connection settings)."""
        self._calls.close()
        if not self._topic_made:
            return
        self._topic_made = False
        await self._delete_reply_topic()

    async def _delete_reply_topic(self) -> None:
        admin = self.broker.config.admin
        try:  # the broker disconnected its admin client on stop: connect one for this
            async with asyncio.timeout(10):
                await admin.connect(**self.broker._connection_kwargs)
                try:
                    response = await admin.client.delete_topics([self.reply_topic])
                finally:
                    await admin.disconnect()
            errors = [code for _, code, *_ in response.topic_error_codes if code]
            if errors:
                raise KafkaError(f"error codes {errors}")
        except Exception as error:  # the app has stopped: say so, and go on
            log.warning("the reply topic %s stays: %s", self.reply_topic, error)
