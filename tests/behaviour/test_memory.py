"""The memory consumer's behaviour (tests/behaviour/conftest.py runs each test in memory and on
the real broker): each call is answered on its reply topic with its correlation id; a call
answered once is answered the same when it comes again; what cannot be read is dead-lettered
and the next call is answered."""

from __future__ import annotations

import json
import uuid
from typing import Any

from broker.topics import dead_letter_topic
from schemas.memory import Invoker
from tests.behaviour.conftest import Rig, own_reply_topic
from tests.integration.helpers import remember_message

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000b1")
PRINCIPAL = Invoker(
    organization_id=ORG,
    definition_id=uuid.UUID("7b000000-0000-4000-8000-00000000d0b1"),
    user_id=uuid.UUID("7b000000-0000-4000-8000-00000000e0b1"),
)


def forget_message(correlation_id: str, reply_to: str, memory_id: str) -> dict[str, Any]:
    message = remember_message(correlation_id, reply_to, PRINCIPAL)
    del message["memory"]
    return {**message, "action": "forget", "memory_id": memory_id}


async def call(rig: Rig, message: dict[str, Any], *, answers: int) -> dict[str, Any]:
    """Send one call and return its answer (the ``answers``-th on its reply topic)."""
    await rig.send(rig.topics.memory_write, json.dumps(message).encode(), key=str(ORG).encode())
    replies = await rig.read(message["reply_to"], until=answers)
    [answer] = [r for r in replies if r["correlation_id"] == message["correlation_id"]]
    return answer


async def test_a_memory_is_written_replayed_refused_as_a_duplicate_and_forgotten(
    rig: Rig,
) -> None:
    await rig.organization(ORG)
    await rig.start("memory")
    replies = await own_reply_topic(rig, "memory-life")
    note = remember_message("first", replies, PRINCIPAL, text="Prefers calls on Tuesdays")

    first = await call(rig, note, answers=1)
    assert (first["status"], first["change"]) == ("written", "created")
    again = await call(rig, {**note, "correlation_id": "again"}, answers=2)  # the same key
    assert (again["status"], again["change"]) == ("written", "created")
    assert again["memory"]["id"] == first["memory"]["id"]  # answered from the journal
    same_text = await call(
        rig, {**note, "correlation_id": "same", "idempotency_key": "k2"}, answers=3
    )
    assert (same_text["status"], same_text["reason"]) == ("refused", "duplicate")

    memory_id = first["memory"]["id"]
    forgotten = await call(rig, forget_message("forget", replies, memory_id), answers=4)
    assert (forgotten["status"], forgotten["change"]) == ("written", "forgotten")
    twice = await call(
        rig, {**forget_message("forget-2", replies, memory_id), "idempotency_key": "k3"}, answers=5
    )
    assert (twice["status"], twice["reason"]) == ("refused", "not_live")


async def test_a_workflow_node_and_a_model_supplied_subject_key_are_refused(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.start("memory")
    replies = await own_reply_topic(rig, "memory-refused")
    node = PRINCIPAL.model_copy(update={"workflow_node": True})
    refused = await call(rig, remember_message("node", replies, node), answers=1)
    assert (refused["status"], refused["reason"]) == ("refused", "workflow_node")
    forged = remember_message(
        "forged", replies, PRINCIPAL, subject_key="crm.company:x:lifecycle_stage"
    )
    invalid = await call(rig, forged, answers=2)
    assert (invalid["status"], invalid["reason"]) == ("refused", "invalid_input")
    assert any("subject_key" in line for line in invalid["details"])


async def test_malformed_json_is_dead_lettered_and_the_next_call_is_answered(rig: Rig) -> None:
    await rig.organization(ORG)
    await rig.start("memory")
    topic = rig.topics.memory_write
    replies = await own_reply_topic(rig, "memory-after-poison")
    await rig.send(topic, b"\xff not json", key=str(ORG).encode())
    answer = await call(rig, remember_message("next", replies, PRINCIPAL), answers=1)
    assert (answer["status"], answer["change"]) == ("written", "created")

    [letter] = await rig.read(dead_letter_topic(topic), until=1)
    assert letter["reason"].startswith("not JSON") or "UTF-8" in letter["reason"]
    assert letter["consumer_group"] == rig.group("memory")
