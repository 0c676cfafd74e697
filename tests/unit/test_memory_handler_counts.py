"""contextcore_memory_writes_total counts each call once by what it did: a call answered again
from the journal is ``replayed``, a written one and a refused one alike (issue 36: a replayed
refusal was counted ``refused`` a second time)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from consumers.memory.handler import MemoryHandler
from consumers.memory.metrics import MemoryMetrics
from consumers.runtime.records import Inbound, Reply, Stopwatch
from schemas.memory import AgentMemory, Answer, Refusal, Written

REPLY_TOPICS = ReplyTopics.of(TopicSettings.model_construct(reply_prefix="replies"))
ORG = uuid.uuid4()


class Service:
    """Answers every call with ``answer`` (the handler's counting is under test)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def remember(self, *_: Any) -> Answer:
        return self.answer


def revision() -> AgentMemory:
    return AgentMemory(
        id=uuid.uuid4(),
        organization_id=ORG,
        definition_id=uuid.uuid4(),
        scope="user",
        user_id=uuid.uuid4(),
        subject_key="user:u:preference.tone",
        text="Short",
        subject_refs=[],
        proposed_by_run_id=None,
        supersedes_id=None,
        forgotten_at=None,
        created_at=datetime.now(UTC),
    )


async def counted(answer: Answer) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry()
    service: Any = Service(answer)  # the one method the handler calls here
    handler = MemoryHandler(
        service,
        MemoryMetrics.create(registry),
        reply_topics=REPLY_TOPICS,
    )
    call = {
        "schema_version": 1,
        "action": "remember",
        "correlation_id": "c-1",
        "reply_to": "replies.test",
        "idempotency_key": "k-1",
        "principal": {
            "organization_id": str(ORG),
            "definition_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
        },
        "memory": {"scope": "user", "attribute": "preference.tone", "text": "Short"},
    }
    record = Inbound("t", 0, 0, None, json.dumps(call).encode())
    assert isinstance(await handler.handle(record, Stopwatch()), Reply)
    found = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "contextcore_memory_writes_total" and sample.value:
                labels = sample.labels
                found[(labels["operation"], labels["outcome"], labels["reason"])] = sample.value
    return found


async def test_a_replayed_refusal_is_counted_replayed_not_refused_again() -> None:
    refusal = Refusal(reason="duplicate", message="already says this", replayed=True)
    assert await counted(refusal) == {("remember", "replayed", ""): 1}


async def test_a_first_refusal_is_counted_refused_with_its_reason() -> None:
    refusal = Refusal(reason="duplicate", message="already says this")
    assert await counted(refusal) == {("remember", "refused", "duplicate"): 1}


async def test_a_replayed_write_is_counted_replayed() -> None:
    written = Written(change="created", memory=revision(), replayed=True)
    assert await counted(written) == {("remember", "replayed", ""): 1}
