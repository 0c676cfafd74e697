"""A client closed while a call is still sending: the call raises what its send raised, and the
``ClientClosed`` its future was failed with is read, so asyncio never logs "Future exception was
never retrieved" (a false error on every busy shutdown)."""

from __future__ import annotations

import asyncio
import gc
import uuid
from typing import Any

import pytest

from producers.client import BuildCalls, Session
from producers.knowledge import KnowledgeClient
from schemas.context import ContextPolicy, ContextRequest, ContextSubject
from schemas.errors import ClientClosed, PublishFailed

REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=uuid.UUID(int=7), user_id=None, trigger_id=None, definition_id=None
    ),
    query="q",
    entities=(),
)
POLICY = ContextPolicy(total_token_budget=10, sources=[])


async def test_a_close_during_a_failing_send_logs_nothing() -> None:
    loop = asyncio.get_running_loop()
    logged: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    calls = BuildCalls("contextcore.reply.x", Session())
    sending = asyncio.Event()
    fail = asyncio.Event()

    async def send() -> None:
        sending.set()
        await fail.wait()
        raise PublishFailed("the broker went away")

    call = asyncio.create_task(calls.call(calls.envelope(REQUEST, POLICY), send, 5))
    await sending.wait()
    calls.close()
    fail.set()
    with pytest.raises(PublishFailed):
        await call
    with pytest.raises(ClientClosed):
        await calls.call(calls.envelope(REQUEST, POLICY), send, 5)
    del call
    gc.collect()
    await asyncio.sleep(0)
    assert logged == []


async def test_an_upload_waiting_for_its_final_status_fails_at_close() -> None:
    """KnowledgeClient: an upload that waits for ``ready`` fails with ``ClientClosed`` when the
    client closes, instead of waiting out its timeout."""
    client = KnowledgeClient(upload_topic="t.upload", bootstrap_servers="unused:1")
    sent = asyncio.Event()

    async def send(*_: Any) -> None:
        sent.set()

    client._send = send  # type: ignore[method-assign,assignment]  # no broker: the wait is the point
    waiting = asyncio.create_task(
        client.upload(
            organization_id=None, title="t", media_type="text/plain", uri="docs://t", content="x"
        )
    )
    await asyncio.wait_for(sent.wait(), 5)
    client._cancel_waiters()
    with pytest.raises(ClientClosed, match="closed while upload"):
        await asyncio.wait_for(waiting, 5)
