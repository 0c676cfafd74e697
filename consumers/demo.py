"""``contextcore demo``: the main job end to end on the embedded default.

Starts (or reuses) the embedded broker and PostgreSQL unless the two addresses are set, applies
the schema, seeds the demo organization, starts the build consumer as its own process, sends one
build request that reads all five sources, and prints the brief and the reply.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from consumers.devstack import DevStack
from consumers.topics import all_topics
from contextcore.models import ContextPolicy, ContextRequest, ContextSubject, ResourceRef
from contextcore.settings import Settings
from contextcore.storage import demo_seed, migrations
from contextcore.storage.pool import connect

DEMO_POLICY = {
    "total_token_budget": 1200,
    "sources": [
        {"name": "conversation", "token_budget": 300},
        {"name": "application", "token_budget": 400, "required": True},
        {"name": "dossier", "token_budget": 250, "options": {"include_user": True}},
        {"name": "definition_summary", "token_budget": 100},
        {"name": "run_history", "token_budget": 150},
    ],
}


async def run_demo(serve: bool) -> int:
    env = dict(os.environ)
    if not (
        os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS")
        or os.environ.get("CONTEXTCORE_DATABASE_URL")
    ):
        print("== starting the embedded broker and PostgreSQL")
        stack = DevStack()
        report = await stack.up(all_topics(Settings()))
        print("\n".join(report.lines(stack.home)))
        addresses = report.addresses
        env["CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"] = addresses.bootstrap_servers
        env["CONTEXTCORE_DATABASE_URL"] = addresses.database_url
        os.environ.update(env)
    settings = Settings()
    print("== applying the schema and seeding the demo organization")
    conn = await connect(settings.require_database_url())
    try:
        done = await migrations.apply_pending(conn)
        print("\n".join(f"applied {m.label}" for m in done) or "schema is up to date")
        await demo_seed.seed_demo(conn)
    finally:
        await conn.close()
    print("== starting the build consumer")
    consumer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumers.cli", "serve", "build", env=env
    )
    try:
        from producers.client import ContextClient

        request = ContextRequest(
            subject=ContextSubject(
                organization_id=demo_seed.ORGANIZATION,
                user_id=demo_seed.USER,
                trigger_id=None,
                definition_id=None,
            ),
            query="What should I know before I call Ada at Acme?",
            entities=(
                ResourceRef(kind="crm.company", id=str(demo_seed.ACME), label="Acme"),
                ResourceRef(kind="crm.deal", id=str(demo_seed.RENEWAL)),
            ),
            conversation_id=demo_seed.CONVERSATION,
        )
        policy = ContextPolicy.model_validate(DEMO_POLICY)
        print("== sending a demo build request")
        started = time.perf_counter()
        async with ContextClient.from_settings(settings) as client:
            reply = await client.request(request, policy, timeout=60.0)
        print(f"== reply after {time.perf_counter() - started:.2f} s (includes the group join)")
        if reply.brief is not None:
            print(reply.brief.text)
            print("==")
        print(json.dumps(reply.model_dump(mode="json"), indent=2))
        if serve:
            print("== serving; Ctrl-C stops the consumer (`contextcore dev down` stops the stack)")
            await consumer.wait()
        return 0 if reply.status == "ok" else 1
    finally:
        if consumer.returncode is None:
            consumer.send_signal(signal.SIGTERM)
        await asyncio.wait_for(consumer.wait(), 30)
