"""One memory write call, one answer.

1. Decode and validate (``schemas.memory``, strict). A ``reply_to`` the reply-topic rule
   refuses is never answered: the call is dead-lettered (``reply_to_refused``), unapplied.
   Invalid input with a usable address is answered ``refused`` / ``invalid_input`` with the
   reasons; without one it is dead-lettered.
2. :class:`~contextcore.memory.service.MemoryService` applies it in one transaction with its
   journal row, so a redelivered call is answered the same and writes nothing.
3. The answer goes to ``reply_to`` with the ``correlation_id``, and the primary's log
   position once the call was applied (a later build naming it reads this state). A writer
   that kept losing the race for a chain's head is a bounded retry; so is a database that does
   not answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

from broker.reply_topics import ReplyTopics
from consumers.memory.metrics import MemoryMetrics
from consumers.runtime.decoding import decode_request
from consumers.runtime.logs import bind_correlation_id
from consumers.runtime.records import DeadLetter, Inbound, Outcome, Reply, Retry, Stopwatch
from contextcore.memory.service import MemoryContention, MemoryService
from contextcore.refs import parse_uuid
from contextcore.storage.positions import WritePosition
from schemas import wire
from schemas.envelope import printable
from schemas.memory import ForgetV1, MemoryAnswerV1, RememberV1, Written, parse_memory_write

log = logging.getLogger("contextcore.consumers.memory")

COUNT_TIMEOUT_S = 2.0
"""How long an answer waits, at most, for its refusal to be counted."""


class MemoryHandler:
    def __init__(
        self,
        service: MemoryService,
        metrics: MemoryMetrics,
        *,
        reply_topics: ReplyTopics,
        position: WritePosition | None = None,
    ) -> None:
        """``position``: the primary's log position, asked once a call is applied, which its
        answer carries (read-your-writes); ``None`` for answers without one."""
        self.service = service
        self.metrics = metrics
        self.reply_topics = reply_topics
        self.position = position

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        named: list[tuple[UUID, str]] = []  # the organization an invalid call names, if any
        with watch.stage("decode"):
            call = self.decode(record.value, named.append)
        if isinstance(call, RememberV1 | ForgetV1):
            bind_correlation_id(call.correlation_id)  # this record's log lines name it
        else:
            for organization, operation in named:
                await self._count_refusal(organization, operation)  # answered invalid_input
            return call
        try:
            with watch.stage("apply"):
                if isinstance(call, RememberV1):
                    answer = await self.service.remember(
                        call.principal, call.memory, call.idempotency_key
                    )
                else:
                    answer = await self.service.forget(
                        call.principal, call.memory_id, call.idempotency_key
                    )
        except MemoryContention as error:
            return Retry("contention", str(error))
        if isinstance(answer, Written):
            if answer.replayed:  # answered from the journal: nothing appended
                self.metrics.count_write(call.action, "replayed")
            else:
                self.metrics.count_write(call.action, "written")
                self.metrics.count_change(answer.change, answer.chain_length)
        elif answer.replayed:  # a refusal answered again from the journal: counted once
            self.metrics.count_write(call.action, "replayed")
        else:
            self.metrics.count_write(call.action, "refused", answer.reason)
            # a reused key, an erased one, or the database refused it (a quota refusal is
            # counted by the metric only: the journal's health counts invalid input)
            if not answer.journaled and answer.reason == "invalid_input":
                await self._count_refusal(call.principal.organization_id, call.action)
        position = None if self.position is None else await self.position()
        return _reply(
            call.reply_to, MemoryAnswerV1.of(call.correlation_id, answer, position=position)
        )

    async def _count_refusal(self, organization_id: UUID, operation: str) -> None:
        """Best effort, bounded: the answer never waits on the count for long, and a count that
        fails (an organization that does not exist, the database away) is logged and dropped."""
        try:
            async with asyncio.timeout(COUNT_TIMEOUT_S):
                await self.service.count_unjournaled_refusal(organization_id, operation)
        except Exception as error:  # best effort by design: the answer matters, not the count
            log.warning("refusal not counted for %s: %s", organization_id, type(error).__name__)

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        """A ``not_handled`` refusal for a call the runtime gave up on."""
        address = wire.address_of(record.value)
        if address is None:
            return None
        topic, correlation_id = address
        self.metrics.count_write("unknown", "refused", "not_handled")
        answer = MemoryAnswerV1(
            correlation_id=correlation_id,
            status="refused",
            reason="not_handled",
            message=printable(f"the call was not handled: {reason}")[:2_000],
        )
        return _reply(topic, answer)

    def decode(
        self,
        value: bytes | None,
        named: Callable[[tuple[UUID, str]], object] = lambda _: None,
    ) -> RememberV1 | ForgetV1 | Reply | DeadLetter:
        """The call, or what to answer instead; ``named`` hears the organization (and the
        operation) an invalid call names, when it names one, read from the JSON decoded once."""

        def invalid(
            topic: str, correlation_id: str, message: str, lines: list[str], data: object
        ) -> Reply:
            self.metrics.count_write("unknown", "refused", "invalid_input")
            if (found := named_organization(data)) is not None:
                named(found)
            return _reply(topic, _refused(correlation_id, message, lines))

        return decode_request(
            value, parse_memory_write, "memory write", invalid, reply_topics=self.reply_topics
        )


def named_organization(data: object) -> tuple[UUID, str] | None:
    """The organization and operation a decoded record that failed validation names, when its
    ``principal.organization_id`` is a UUID; the operation is ``unknown`` unless the action is
    one."""
    if not isinstance(data, dict) or not isinstance(data.get("principal"), dict):
        return None
    raw = data["principal"].get("organization_id")
    organization = parse_uuid(raw) if isinstance(raw, str) else None
    if organization is None:
        return None
    action = data.get("action")
    return organization, action if action in ("remember", "forget") else "unknown"


def _refused(correlation_id: str, message: str, details: list[str]) -> MemoryAnswerV1:
    return MemoryAnswerV1(
        correlation_id=correlation_id,
        status="refused",
        reason="invalid_input",
        message=printable(message)[:2_000],
        details=[printable(line)[:2_000] for line in details[:50]],
    )


def _fallback(correlation_id: str) -> Callable[[str], MemoryAnswerV1]:
    return lambda reason: _refused(correlation_id, reason, [])


def _reply(topic: str, answer: MemoryAnswerV1) -> Reply:
    return Reply(topic, answer.correlation_id, answer, fallback=_fallback(answer.correlation_id))
