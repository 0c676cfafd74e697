"""A FastStream app getting briefs on its own broker connection (issue 35, item 6): the example
of docs/clients.md, run against the real broker and a real build consumer. A handler of the
app's own topic asks for a brief with :class:`producers.faststream.ContextBriefs` and publishes
what it got; the brief holds the organization's company, an error reply is raised as
``BuildFailed``, and the app's reply topic is gone once the app stopped."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from faststream import FastStream
from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from devstack.stack import TANSU_FETCH_MAX_WAIT_MS
from producers.client import BuildFailed
from producers.faststream import ContextBriefs
from schemas.context import (
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
)
from schemas.errors import ConfigurationError
from tests.integration import seed
from tests.integration.helpers import read_json
from tests.services import Config, StartConsumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

POLICY = ContextPolicy(
    total_token_budget=400, sources=[ContextSourceSpec(name="application", token_budget=400)]
)


class Question(BaseModel):
    """What the example app is asked on its own topic."""

    organization_id: uuid.UUID
    company_id: uuid.UUID
    policy: ContextPolicy = POLICY


def example_app(config: Config, questions: str, answers: str) -> tuple[FastStream, ContextBriefs]:
    """The app of docs/clients.md ("FastStream"): questions in, briefs (or errors) out."""
    broker = KafkaBroker(config.bootstrap)
    briefs = ContextBriefs.from_settings(broker, config.topics)

    @broker.subscriber(
        questions,
        group_id=f"{questions}.app",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=TANSU_FETCH_MAX_WAIT_MS,
    )
    @broker.publisher(answers)
    async def answer(question: Question) -> dict[str, str]:
        request = ContextRequest(
            subject=ContextSubject(
                organization_id=question.organization_id,
                user_id=None,
                trigger_id=None,
                definition_id=None,
            ),
            query="what do we know of this company?",
            entities=(ResourceRef(kind="crm.company", id=str(question.company_id)),),
        )
        try:
            brief = await briefs.build(request, question.policy, timeout=60)
        except BuildFailed as failed:
            return {"error": failed.error.code}
        return {"brief": brief.text}

    return FastStream(broker, after_startup=[briefs.start], after_shutdown=[briefs.close]), briefs


async def topics_of(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_faststream_app_gets_briefs_on_its_own_broker_connection(
    config: Config, start_consumer: StartConsumer, admin: asyncpg.Connection
) -> None:
    organization = await seed.organization(admin)
    company = await seed.company(admin, organization, name="Acme Robotics")
    await start_consumer(config)
    questions, answers = f"{config.request_topic}.questions", f"{config.request_topic}.answers"
    app, briefs = example_app(config, questions, answers)
    await app.start()
    try:
        assert briefs.reply_topic in await topics_of(config.bootstrap)
        with pytest.raises(ConfigurationError, match="before the app's broker starts"):
            ContextBriefs(briefs.broker)  # FastStream would never start its subscriber
        asked = KafkaBroker(config.bootstrap)
        async with asked:
            await asked.start()
            await asked.publish(
                Question(organization_id=organization, company_id=company), questions
            )
            refused = ContextPolicy(
                total_token_budget=10,
                sources=[ContextSourceSpec(name="no_such_source", token_budget=5)],
            )
            await asked.publish(
                Question(organization_id=organization, company_id=company, policy=refused),
                questions,
            )
        # the app's handler awaits each brief from inside FastStream's own loop
        brief, error = await read_json(config.bootstrap, answers, until=2)
        direct = await briefs.build(
            ContextRequest(
                subject=ContextSubject(
                    organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
                ),
                query="another organization asks for the same company",
                entities=(ResourceRef(kind="crm.company", id=str(company)),),
            ),
            POLICY,
            timeout=60,
        )
    finally:
        await app.stop()
    assert f"[crm.company:{company}] name: Acme Robotics" in brief["brief"], json.dumps(brief)
    assert error == {"error": "policy_rejected"}
    assert "Acme Robotics" not in direct.text  # scoped to the asking organization
    assert briefs._calls.waiting == []
    assert briefs.reply_topic not in await topics_of(config.bootstrap)
