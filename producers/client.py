"""``ContextClient``: publish a build request and await its reply.

Request/reply over Kafka without broker support: each client creates its own one-partition reply
topic (``<reply_topic_prefix>.<client id>``), reads it from the beginning, and deletes it on
close. A fresh topic has no old records, so the client never depends on the broker's end offsets
(which Tansu reports wrongly). The service answers only on a topic the reply-topic rule allows
(:mod:`broker.reply_topics`), so a client checks its own against the same rule when it is made,
and one the service would refuse is a :class:`~schemas.errors.ConfigurationError` before
anything is sent.

Replies are matched by correlation id, and the client owns every id: each request gets a new,
unguessable one (:func:`new_correlation_id`, 128 bits from :mod:`secrets`), never one the caller
chose. So an id is never reused: a reply nobody waits for (a duplicate after a consumer restart,
a late one after a timeout, one whose id this client never made) is ignored, and can never
answer a later request, whoever made it (a caller that reused an id after its timeout used to
receive the earlier request's reply: organization A's brief handed to organization B's caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Required, Self, TypedDict, Unpack
from uuid import UUID

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from broker.lanes import organization_header
from broker.reply_topics import ReplyTopics, client_reply_topic
from broker.settings import KafkaSettings, TopicSettings
from broker.topics import TopicSpec, delete_topics, ensure_topics, reach
from broker.tracing import trace_headers
from schemas.build import BuildReplyV1, BuildRequestV1, ErrorInfo
from schemas.context import ContextBrief, ContextPolicy, ContextRequest
from schemas.errors import (
    ClientClosed,
    ConfigurationError,
    InfrastructureUnavailable,
    PublishFailed,
    ReplyTimeout,
    RequestRefused,
)
from schemas.position import latest

log = logging.getLogger("contextcore.client")

__all__ = ["BuildFailed", "ContextClient", "ReplyTimeout", "Session"]


def new_correlation_id() -> str:
    """A correlation id no caller chooses and nobody can guess (128 bits from :mod:`secrets`):
    every client makes one per request, so a reply is only ever matched to its own request."""
    return secrets.token_hex(16)


def own_reply_topic(prefix: str, client_id: str, rule: ReplyTopics | None) -> str:
    """The reply topic of the client ``client_id`` (``<prefix>.<client id>``), once ``rule``
    admits it (unless given, the default rule of ``prefix``).

    Raises:
        ConfigurationError: the rule refuses it: the service would never answer there.
    """
    topic = client_reply_topic(prefix, client_id)
    if rule is None:
        rule = ReplyTopics.of(TopicSettings.model_construct(reply_prefix=prefix))
    refused = rule.refusal(topic)
    if refused is not None:
        raise ConfigurationError(f"no reply could ever reach this client: {refused}")
    return topic


def request_headers(organization: UUID | None) -> list[tuple[str, bytes]]:
    """What every request carries beside its body: its organization (the consumer serves
    organizations in turn: broker/lanes.py) and the current span's trace context (none without
    a span: broker/tracing.py)."""
    return [organization_header(organization), *trace_headers()]


def not_taken(topic: str, send_timeout_s: float, error: BaseException) -> PublishFailed:
    """The error of a request the broker did not take on ``topic`` (refused, or not within
    ``send_timeout_s``)."""
    return PublishFailed(
        f"the broker did not take the request on {topic} within"
        f" {send_timeout_s:g} s: {type(error).__name__} {error}"
    )


class BuildFailed(RequestRefused):
    """The service answered a build request with an error reply (``error`` holds it whole)."""

    def __init__(self, error: ErrorInfo) -> None:
        self.error = error
        super().__init__(error.code, error.message, error.details)


class Session:
    """Read-your-writes for one caller: the latest database position its writes were answered
    with (a memory answer's, an upload's ``ready``). Clients given the same session note every
    position they are answered with, and a :class:`ContextClient` names the latest in each build
    request (``read_after``), so a brief reflects what the caller was told is written, even
    with the service's sources on a replica that lags (docs/scaling.md)::

        session = Session()
        async with MemoryClient(..., session=session) as memory, ContextClient(
            ..., session=session
        ) as context:
            await memory.remember(...)
            brief = await context.build(...)  # the memory is there

    A client without one has its own, which only its own answers fill."""

    def __init__(self) -> None:
        self.position: str | None = None

    def note(self, position: str | None) -> None:
        self.position = latest(self.position, position)


class ChannelOptions(TypedDict, total=False):
    """How a client reaches the broker and its replies: what every client's constructor takes
    beside its own request topic (the defaults are :class:`ReplyChannel`'s)."""

    bootstrap_servers: Required[str]
    reply_topic_prefix: str
    reply_topics: ReplyTopics
    fetch_max_wait_ms: int
    connect_timeout_s: float
    max_in_flight: int
    send_timeout_s: float
    session: Session


def channel_options(kafka: KafkaSettings, topics: TopicSettings) -> ChannelOptions:
    """The :class:`ChannelOptions` the settings name (``from_settings`` of every client)."""
    return ChannelOptions(
        bootstrap_servers=kafka.require_bootstrap_servers(),
        reply_topic_prefix=topics.reply_prefix,
        reply_topics=ReplyTopics.of(topics),
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        connect_timeout_s=kafka.connect_timeout_s,
    )


class ReplyChannel:
    """A producer and the client's own reply topic: the part every client shares.

    Subclasses publish with :meth:`_send` and receive each record of the reply topic in
    :meth:`_on_reply`. Use as ``async with``.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        reply_topic_prefix: str = "contextcore.reply",
        reply_topics: ReplyTopics | None = None,
        fetch_max_wait_ms: int = 500,
        connect_timeout_s: float = 10.0,
        max_in_flight: int = 64,
        send_timeout_s: float = 30.0,
        session: Session | None = None,
    ) -> None:
        """``reply_topics``: the service's reply-topic rule (``from_settings`` passes the
        settings' one); unless given, the default rule of ``reply_topic_prefix``.
        ``max_in_flight``: sends that may wait for the broker at once; more wait in the
        client, so a burst of calls never overruns the producer's buffer and its timeout.
        ``send_timeout_s``: how long the broker has to take one (then :class:`PublishFailed`).
        ``session``: the positions of this caller's writes, shared with its other clients.

        Raises:
            ConfigurationError: the rule refuses this client's reply topic (the service would
                never answer on it).
        """
        if max_in_flight < 1 or send_timeout_s <= 0:
            raise ValueError("max_in_flight must be at least 1 and send_timeout_s positive")
        self.bootstrap_servers = bootstrap_servers
        self.client_id = uuid.uuid4().hex
        self.reply_topic = own_reply_topic(reply_topic_prefix, self.client_id, reply_topics)
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._connect_timeout_s = connect_timeout_s
        self.session = session or Session()
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._send_timeout_s = send_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        await ensure_topics(
            self.bootstrap_servers,
            [TopicSpec(self.reply_topic, 1)],
            timeout_s=self._connect_timeout_s,
        )
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            acks="all",
            enable_idempotence=False,
            linger_ms=0,
            request_timeout_ms=int(self._send_timeout_s * 1000),
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self._fetch_max_wait_ms,
        )
        try:
            await reach(self._producer.start(), self.bootstrap_servers, self._connect_timeout_s)
            await reach(self._consumer.start(), self.bootstrap_servers, self._connect_timeout_s)
        except InfrastructureUnavailable:
            await self.close()
            raise
        self._consumer.assign([TopicPartition(self.reply_topic, 0)])
        self._reader = asyncio.create_task(self._read_replies(self._consumer))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        self._cancel_waiters()
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
            await delete_topics(self.bootstrap_servers, [self.reply_topic])

    async def _read_replies(self, consumer: AIOKafkaConsumer) -> None:
        async for record in consumer:
            self._on_reply(record.value or b"", record.offset)

    async def _send(
        self, topic: str, value: bytes, key: bytes, organization: UUID | None = None
    ) -> None:
        """Publish one request, at most ``max_in_flight`` at a time, with its organization (the
        consumer serves organizations in turn: broker/lanes.py) and the current span's trace
        context in its headers (broker/tracing.py; none without a span).

        Raises:
            PublishFailed: the broker did not take it within ``send_timeout_s`` or refused it.
        """
        if self._producer is None:
            raise RuntimeError(f"{type(self).__name__}.start() was not called")
        async with self._in_flight:
            try:
                async with asyncio.timeout(self._send_timeout_s + 5):
                    await self._producer.send_and_wait(
                        topic,
                        value,
                        key=key,
                        headers=request_headers(organization),
                    )
            except (KafkaError, TimeoutError) as error:
                raise not_taken(topic, self._send_timeout_s, error) from error

    def _on_reply(self, value: bytes, offset: int) -> None:
        raise NotImplementedError

    def _cancel_waiters(self) -> None:
        """Called on close: nothing more will arrive."""


class BuildCalls:
    """Build requests waiting for their replies, matched by correlation id: the rules every
    build client follows, whatever carries its records (:class:`ContextClient` its own
    connection, :class:`producers.faststream.ContextBriefs` a FastStream app's broker).

    Each request gets a new id of :func:`new_correlation_id` and names ``reply_topic``; a reply
    is matched to the call waiting on its id and to nothing else (a late, duplicate or foreign
    one is ignored); a call's wait is bounded from the moment the broker took the request.
    """

    def __init__(self, reply_topic: str, session: Session) -> None:
        self.reply_topic = reply_topic
        self.session = session
        self._pending: dict[str, asyncio.Future[BuildReplyV1]] = {}
        self.closed = False

    def envelope(
        self,
        request: ContextRequest,
        policy: ContextPolicy,
        *,
        explain: bool = False,
        read_after: str | None = None,
    ) -> BuildRequestV1:
        """A new request: a fresh correlation id, this caller's reply topic, and reading after
        ``read_after`` and the session's latest position, whichever is later."""
        return BuildRequestV1(
            correlation_id=new_correlation_id(),
            reply_to=self.reply_topic,
            request=request,
            policy=policy,
            explain=explain,
            read_after=latest(read_after, self.session.position),
        )

    async def call(
        self, envelope: BuildRequestV1, send: Callable[[], Awaitable[None]], timeout: float
    ) -> BuildReplyV1:
        """Send ``envelope`` with ``send`` and wait ``timeout`` seconds, once it was sent, for its
        reply.

        Raises:
            ReplyTimeout: no reply within ``timeout`` seconds; a reply that comes later is
                ignored.
            ClientClosed: the client closed, before or while the call waited.
        """
        if self.closed:
            raise ClientClosed("the client is closed")
        future: asyncio.Future[BuildReplyV1] = asyncio.get_running_loop().create_future()
        self._pending[envelope.correlation_id] = future
        try:
            await send()
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise ReplyTimeout(
                f"no reply to {envelope.correlation_id} within {timeout:g} s"
            ) from None
        finally:
            self._pending.pop(envelope.correlation_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # a close while the send failed: read, so never logged

    def answer(self, value: bytes, offset: int) -> None:
        """One record of the reply topic: the answer of the call waiting on its id, if any."""
        try:
            reply = BuildReplyV1.model_validate_json(value)
        except ValidationError:
            log.warning("ignoring a malformed reply at offset %d", offset)
            return
        future = self._pending.pop(reply.correlation_id, None)
        if future is not None and not future.done():
            future.set_result(reply)

    @property
    def waiting(self) -> list[str]:
        """The correlation ids of the calls waiting for their replies."""
        return list(self._pending)

    def close(self) -> None:
        """Nothing more will arrive: every waiting call fails with :class:`ClientClosed`, and
        a call made later fails at once."""
        self.closed = True
        for correlation_id, future in self._pending.items():
            if not future.done():
                future.set_exception(
                    ClientClosed(f"the client closed while {correlation_id} waited")
                )
        self._pending.clear()


class BriefRequests(ABC):
    """What a build client offers: :meth:`request` carries one request to its reply,
    :meth:`build` makes its brief of it (:class:`ContextClient` on its own connection,
    :class:`producers.faststream.ContextBriefs` on a FastStream app's)."""

    @abstractmethod
    async def request(
        self,
        request: ContextRequest,
        policy: ContextPolicy,
        *,
        timeout: float = 10.0,
        explain: bool = False,
        read_after: str | None = None,
    ) -> BuildReplyV1: ...

    async def build(
        self,
        request: ContextRequest,
        policy: ContextPolicy,
        *,
        timeout: float = 10.0,
        read_after: str | None = None,
    ) -> ContextBrief:
        """The brief for ``request`` under ``policy`` (see the client's ``request``).

        Raises:
            BuildFailed: the service answered with an error (invalid request, policy, …).
            ReplyTimeout: no reply within ``timeout`` seconds.
            PublishFailed: the broker did not take the request.
        """
        reply = await self.request(request, policy, timeout=timeout, read_after=read_after)
        if reply.status == "error":
            assert reply.error is not None
            raise BuildFailed(reply.error)
        assert reply.brief is not None
        return reply.brief


class ContextClient(ReplyChannel, BriefRequests):
    """An async client of the build-request topic. Use as ``async with ContextClient(...)``."""

    def __init__(self, *, request_topic: str, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(**options)
        self.request_topic = request_topic
        self._calls = BuildCalls(self.reply_topic, self.session)

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, topics: TopicSettings) -> ContextClient:
        return cls(request_topic=topics.build_request, **channel_options(kafka, topics))

    async def start(self) -> None:
        self._calls.closed = False  # a client may start again after a close
        await super().start()

    def _cancel_waiters(self) -> None:
        self._calls.close()

    def _on_reply(self, value: bytes, offset: int) -> None:
        self._calls.answer(value, offset)

    async def request(
        self,
        request: ContextRequest,
        policy: ContextPolicy,
        *,
        timeout: float = 10.0,
        explain: bool = False,
        read_after: str | None = None,
    ) -> BuildReplyV1:
        """Publish one request and return its reply, brief or error, as the service sent it.
        The request's correlation id is a new one of this client's (the reply carries it).
        With ``explain`` an ok reply carries the brief's manifest (why each item is in it or
        not: ``BuildReplyV1.manifest``). The request reads after ``read_after`` and the
        session's latest position, whichever is later.

        Raises:
            ReplyTimeout: no reply within ``timeout`` seconds; a reply that comes later is
                ignored.
            PublishFailed: the broker did not take the request.
        """
        envelope = self._calls.envelope(request, policy, explain=explain, read_after=read_after)
        return await self._calls.call(
            envelope,
            lambda: self._send(
                self.request_topic,
                envelope.model_dump_json().encode(),
                envelope.correlation_id.encode(),
                request.subject.organization_id,
            ),
            timeout,
        )
