"""``contextcore dev demo``: the main job end to end on the embedded default.

Starts (or reuses) the embedded broker and PostgreSQL unless the addresses are set, provisions
the two credentials, applies the schema as the owner, seeds the demo organization as the
administrator (standing in for the application that owns those rows), starts the build, upload,
embedding and memory consumers as their own processes with the runtime login, uploads two
documents (one of the organization's, one of the platform's) and waits until they are ready,
remembers two facts through the memory-write topic (a preference of the user, an observation
about Acme), sends one build request that reads all seven sources, and prints the brief and the
reply.

With ``CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS`` set, nothing embedded starts; the database URLs
(``CONTEXTCORE_DATABASE_URL``, ``_OWNER_URL`` and ``_ADMIN_URL``) must then be set too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import all_topics
from contextcore.storage import migrations
from contextcore.storage.pool import connect, with_database
from contextcore.storage.provision import Login, provision
from contextcore.storage.settings import DatabaseSettings
from devstack import demo_seed
from devstack.stack import DevStack
from producers.client import ContextClient
from producers.explain import explain
from producers.knowledge import KnowledgeClient
from producers.memory import MemoryClient
from schemas.context import ContextPolicy, ContextRequest, ContextSubject, ResourceRef
from schemas.memory import Invoker, MemoryCandidate, MemorySubjectRef

DEMO_POLICY = {
    "total_token_budget": 1700,
    "sources": [
        {"name": "conversation", "token_budget": 300},
        {"name": "application", "token_budget": 400, "required": True},
        {"name": "dossier", "token_budget": 250, "options": {"include_user": True}},
        {"name": "definition_summary", "token_budget": 100},
        {"name": "run_history", "token_budget": 150},
        {
            "name": "knowledge",
            "token_budget": 300,
            "limit": 3,
            "options": {"include_platform": True, "include_organization": True},
        },
        {"name": "memory", "token_budget": 200},
    ],
}

DEMO_REQUEST = ContextRequest(
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
"""The demo's turn: a call about Acme and its renewal (tests/integration/test_explained_builds.py
asks it too)."""

MEMORIES = [
    ("user", "preference.call_notes", "Send me call notes as three bullet points.", None),
    (
        "organization",
        "observation.buying_process",
        "Acme buys through a procurement portal; quotes must be uploaded there.",
        ("crm.company", str(demo_seed.ACME)),
    ),
]

DOCUMENTS = [
    (
        "organization",
        "Acme account handbook",
        "docs://acme/handbook",
        "# Acme account handbook\n\n## Calls\n\nAda prefers calls on Tuesday mornings and "
        "wants the agenda by email the day before.\n\n## Renewal\n\nThe renewal needs the "
        "procurement team's sign-off; start it 60 days before the contract ends.\n",
    ),
    (
        "platform",
        "CRM basics",
        "docs://platform/crm-basics",
        "# CRM basics\n\n## Lifecycle\n\nA company's lifecycle stage says how far it is "
        "from lead to customer: lead, opportunity, customer, churned.\n",
    ),
]


def runtime_environ(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the owner's and the administrator's credentials: what a service gets."""
    privileged = {"CONTEXTCORE_DATABASE_OWNER_URL", "CONTEXTCORE_DATABASE_ADMIN_URL"}
    return {name: value for name, value in env.items() if name not in privileged}


async def run_demo(serve: bool) -> int:
    if not os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS"):
        print("== starting the embedded broker and PostgreSQL")
        stack = DevStack()
        report = await stack.up(all_topics(TopicSettings()))
        print("\n".join(report.lines(stack.home)))
        os.environ.update(report.addresses.environ())
    env = dict(os.environ)
    database = DatabaseSettings()
    print("== provisioning, applying the schema and seeding the demo organization")
    admin_url = database.require_admin_url()
    await provision(
        admin_url, owner_url=database.require_owner_url(), runtime_url=database.require_url()
    )
    conn = await connect(database.require_owner_url())
    try:
        done = await migrations.apply_pending(conn)
        print("\n".join(f"applied {m.label}" for m in done) or "schema is up to date")
    finally:
        await conn.close()
    seeder = await connect(with_database(admin_url, Login.of(database.require_url()).database))
    try:
        await demo_seed.seed_demo(seeder)
    finally:
        await seeder.close()
    print("== starting the build, upload, embedding and memory consumers (as the runtime login)")
    consumers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumers.cli", "serve", name, env=runtime_environ(env)
        )
        for name in ("build", "upload", "embed", "memory")
    ]
    consumer = consumers[0]
    try:
        print("== uploading two documents and waiting until they are searchable")
        async with KnowledgeClient.from_settings(KafkaSettings(), TopicSettings()) as uploads:
            for scope, title, uri, text in DOCUMENTS:
                status = await uploads.upload(
                    organization_id=demo_seed.ORGANIZATION if scope == "organization" else None,
                    title=title,
                    media_type="text/markdown",
                    uri=uri,
                    content=text,
                    idempotency_key=f"demo:{uri}:v1",
                    timeout=300.0,
                )
                print(f"{title} ({scope}): {status.status}, {status.chunks} chunk(s)")
        print("== remembering two facts (memory.remember over the memory-write topic)")
        researcher = Invoker(
            organization_id=demo_seed.ORGANIZATION,
            definition_id=demo_seed.RESEARCHER,
            user_id=demo_seed.USER,
        )
        async with MemoryClient.from_settings(KafkaSettings(), TopicSettings()) as memory:
            for scope, attribute, text, about in MEMORIES:
                refs = [MemorySubjectRef(kind=about[0], id=about[1])] if about else []
                answer = await memory.remember(
                    researcher,
                    MemoryCandidate(
                        scope=scope,
                        attribute=attribute,
                        text=text,
                        subject_refs=refs,
                    ),
                    idempotency_key=f"demo:{attribute}:v1",
                )
                print(f"{attribute}: {answer.status} {answer.change or answer.reason}")
        request = DEMO_REQUEST
        policy = ContextPolicy.model_validate(DEMO_POLICY)
        print("== sending a demo build request")
        started = time.perf_counter()
        async with ContextClient.from_settings(KafkaSettings(), TopicSettings()) as client:
            reply = await client.request(request, policy, timeout=60.0, explain=True)
        print(f"== reply after {time.perf_counter() - started:.2f} s (includes the group join)")
        if reply.brief is not None and reply.manifest is not None:
            print("== the brief, and why each item is in it or not (explain: true)")
            print(explain(reply.brief, reply.manifest))
            print("==")
        print(json.dumps(reply.model_dump(mode="json", exclude={"manifest"}), indent=2))
        if serve:
            print("== serving; Ctrl-C stops the consumers (`contextcore dev down` stops the stack)")
            await consumer.wait()
        return 0 if reply.status == "ok" else 1
    finally:
        for process in consumers:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in consumers:
            await asyncio.wait_for(process.wait(), 30)
