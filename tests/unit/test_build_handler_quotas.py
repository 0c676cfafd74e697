"""The build handler's admission by the quota build_rate (contextcore/quotas.py), on an
in-memory :class:`~contextcore.quotas.QuotaReader`: its screen, which the runtime runs on each
record's receipt, holds each organization to its own quotas, read per request, and never
throttles one without any, nor a record it cannot read."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest
from prometheus_client import CollectorRegistry

from broker.settings import KafkaSettings, TopicSettings
from consumers.build.app import create_app
from consumers.build.handler import BuildHandler
from consumers.build.metrics import BuildMetrics
from consumers.build.settings import BuildSettings
from consumers.runtime.records import Inbound, Stopwatch
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.quotas import NO_QUOTAS, Quotas
from contextcore.storage.settings import DatabaseSettings
from tests.unit.test_build_messages import ORG, REPLY_TOPICS, message, reply_of, service

OTHER = "6f1c2a3b-0000-4000-8000-000000000002"


class Book:
    """Quotas by organization; every read counted."""

    def __init__(self, quotas: dict[str, Quotas]) -> None:
        self.by_organization = quotas
        self.reads = 0

    async def quotas(self, organization_id: uuid.UUID) -> Quotas:
        self.reads += 1
        return self.by_organization.get(str(organization_id), NO_QUOTAS)


def handler_with(quotas: Book | None) -> BuildHandler:
    """A build handler over the in-memory service, reading ``quotas`` (none: no reader)."""
    registry, builder = service()
    metrics = BuildMetrics.create(CollectorRegistry())
    return BuildHandler(registry, builder, metrics, reply_topics=REPLY_TOPICS, quotas=quotas)


async def statuses(handler: BuildHandler, organization: str, n: int) -> list[str]:
    answers: list[str] = []
    for i in range(n):
        raw = message(correlation_id=f"{organization}-{i}")
        raw["request"]["subject"]["organization_id"] = organization
        record = Inbound("t", 0, i, None, json.dumps(raw).encode())
        screened = await handler.screen(record)
        reply = reply_of(screened or await handler.handle(record, Stopwatch()))
        answers.append(reply.error.code if reply.error else reply.status)
    return answers


async def test_an_organization_is_throttled_past_its_own_burst_and_another_never() -> None:
    book = Book({ORG: Quotas(build_rate=0.001, build_burst=2)})
    handler = handler_with(book)
    assert await statuses(handler, ORG, 4) == ["ok", "ok", "throttled", "throttled"]
    assert await statuses(handler, OTHER, 4) == ["ok"] * 4
    assert book.reads == 8  # read per request: the reader keeps them (DatabaseQuotas: 5 s)
    book.by_organization[ORG] = Quotas(build_rate=1_000.0, build_burst=1_000)
    await asyncio.sleep(0.01)  # at least ten tokens at the raised rate (a sleep is never shorter)
    assert await statuses(handler, ORG, 1) == ["ok"]


async def test_a_record_the_screen_cannot_read_is_left_to_the_handler() -> None:
    book = Book({ORG: Quotas(build_rate=0.001, build_burst=1)})
    handler = handler_with(book)
    nameless = message()
    del nameless["request"]["subject"]["organization_id"]
    for value in (b"not json", b"[]", json.dumps(nameless).encode()):
        assert await handler.screen(Inbound("t", 0, 0, None, value)) is None
    assert book.reads == 0


async def test_without_a_quota_reader_nothing_is_throttled() -> None:
    handler = handler_with(None)
    assert await statuses(handler, ORG, 20) == ["ok"] * 20
    assert handler.quotas is None


def test_the_build_rates_first_settings_are_warned_about_not_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CONTEXTCORE_BUILD_ORGANIZATION_RATE", "5")
    with caplog.at_level(logging.WARNING, logger="contextcore.build"):
        create_app(
            BuildSettings.model_construct(group_id="g"),
            KafkaSettings.model_construct(),
            TopicSettings.model_construct(),
            DatabaseSettings.model_construct(),
            KnowledgeSettings.model_construct(),
        )
    assert "CONTEXTCORE_BUILD_ORGANIZATION_RATE is no longer read" in caplog.text
