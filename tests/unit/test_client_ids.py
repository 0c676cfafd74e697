"""Every client owns its correlation ids (issue 17, item 5): no caller chooses one, so none is
reused, and a late reply can only ever match the request it answers."""

from __future__ import annotations

import inspect
import re
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from producers.client import ContextClient, new_correlation_id
from producers.knowledge import KnowledgeClient
from producers.memory import MemoryClient


@pytest.mark.parametrize(
    "call",
    [
        ContextClient.request,
        ContextClient.build,
        KnowledgeClient.upload,
        KnowledgeClient.upload_file,
        KnowledgeClient.reingest,
        MemoryClient.remember,
        MemoryClient.forget,
    ],
)
def test_no_client_call_takes_a_correlation_id(call: Callable[..., Any]) -> None:
    assert "correlation_id" not in inspect.signature(call).parameters


def test_correlation_ids_are_new_and_from_the_systems_randomness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = {new_correlation_id() for _ in range(1_000)}
    assert len(ids) == 1_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    asked: list[int | None] = []

    def token_hex(nbytes: int | None = None) -> str:
        asked.append(nbytes)
        return "ab" * (nbytes or 0)

    monkeypatch.setattr(secrets, "token_hex", token_hex)
    assert new_correlation_id() == "ab" * 16
    assert asked == [16]  # 128 bits from secrets, not a seeded generator
