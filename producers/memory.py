"""``MemoryClient``: ``memory.remember`` and ``memory.forget`` over the memory-write topic.

Each call waits for its answer on the client's reply topic, matched by correlation id. A refusal
is an answer (``status: refused`` with its reason), not an error: ``duplicate`` is the expected
answer to re-observing unchanged text. Records are keyed by organization (one tenant's calls
share a partition), but the consumer applies many at once: two calls on one chain race, and
the database keeps the chain linear. Delivery is at least once: the idempotency key (a fresh
uuid4 per call unless given; a key is unique in its organization) makes a redelivered call
answer the same and write nothing. Correlation ids are the client's own, new and unguessable for
every call (:func:`~producers.client.new_correlation_id`), and never stored: an answer nobody
waits for is ignored, and one meant for an earlier call can never answer a later one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Unpack
from uuid import UUID

from pydantic import ValidationError

from broker.settings import KafkaSettings, TopicSettings
from producers.client import ChannelOptions, ReplyChannel, channel_options, new_correlation_id
from schemas.errors import ClientClosed, ReplyTimeout
from schemas.memory import ForgetV1, Invoker, MemoryAnswerV1, MemoryCandidate, RememberV1

log = logging.getLogger("contextcore.client")


class MemoryClient(ReplyChannel):
    def __init__(self, *, memory_topic: str, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(**options)
        self.memory_topic = memory_topic
        self._waiting: dict[str, asyncio.Future[MemoryAnswerV1]] = {}

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, topics: TopicSettings) -> MemoryClient:
        return cls(memory_topic=topics.memory_write, **channel_options(kafka, topics))

    def _on_reply(self, value: bytes, offset: int) -> None:
        try:
            answer = MemoryAnswerV1.model_validate_json(value)
        except ValidationError:
            log.warning("ignoring a malformed memory answer at offset %d", offset)
            return
        waiter = self._waiting.get(answer.correlation_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def _cancel_waiters(self) -> None:
        for correlation_id, waiter in self._waiting.items():
            if not waiter.done():
                waiter.set_exception(
                    ClientClosed(f"the client closed while {correlation_id} waited")
                )

    async def remember(
        self,
        principal: Invoker,
        memory: MemoryCandidate,
        *,
        idempotency_key: str | None = None,
        timeout: float = 30.0,
    ) -> MemoryAnswerV1:
        """Store ``memory`` for ``principal``: the new revision, or a refusal with its reason.

        Raises:
            ReplyTimeout: no answer within ``timeout`` seconds.
            PublishFailed: the broker did not take the call.
        """
        message = RememberV1(
            action="remember", memory=memory, **self._addressed(principal, idempotency_key)
        )
        return await self._call(message, timeout)

    async def forget(
        self,
        principal: Invoker,
        memory_id: UUID,
        *,
        idempotency_key: str | None = None,
        timeout: float = 30.0,
    ) -> MemoryAnswerV1:
        """Append a tombstone after the live revision ``memory_id``, or a refusal.

        Raises:
            ReplyTimeout: no answer within ``timeout`` seconds.
            PublishFailed: the broker did not take the call.
        """
        message = ForgetV1(
            action="forget", memory_id=memory_id, **self._addressed(principal, idempotency_key)
        )
        return await self._call(message, timeout)

    def _addressed(self, principal: Invoker, idempotency_key: str | None) -> dict[str, Any]:
        """What every call carries: a new correlation id, this client's reply topic, the key
        (a new one unless the caller names it) and who calls."""
        return {
            "correlation_id": new_correlation_id(),
            "reply_to": self.reply_topic,
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
            "principal": principal,
        }

    async def _call(self, message: RememberV1 | ForgetV1, timeout: float) -> MemoryAnswerV1:
        organization_id = message.principal.organization_id
        key = message.correlation_id
        waiter: asyncio.Future[MemoryAnswerV1] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        try:
            await self._send(
                self.memory_topic,
                message.model_dump_json().encode(),
                str(organization_id).encode(),
                organization_id,
            )
            async with asyncio.timeout(timeout):
                answer = await waiter
        except TimeoutError:
            waited = f"{timeout:g} s"
            raise ReplyTimeout(f"memory {message.action} {key} unanswered in {waited}") from None
        finally:
            self._waiting.pop(key, None)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # a close while the send failed: read, so never logged
        self.session.note(answer.position)
        return answer
