"""``contextcore``: the embedded dev stack, the consumers, and the demo.

    contextcore dev up|down|status|env   the embedded broker + PostgreSQL on 127.0.0.1
    contextcore serve build              run the build consumer until SIGTERM/SIGINT
    contextcore demo [--serve]           the main job end to end on the embedded default
    contextcore policy check FILE.json   admit a context policy as the build consumer would

Every failure to reach the broker or the database, and every missing setting, prints one line
and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from consumers.build import BuildConsumer
from consumers.devstack import DevStack
from consumers.metrics import serve_metrics
from consumers.sources import process_registry
from consumers.topics import all_topics, build_topics, ensure_topics
from contextcore.builder import DefaultContextBuilder
from contextcore.errors import (
    ContextcoreError,
    InfrastructureUnavailable,
    SchemaError,
    validation_lines,
)
from contextcore.models import ContextPolicy, ContextRequest, ContextSubject, ResourceRef
from contextcore.packer import ContextPacker
from contextcore.registry import PolicyError
from contextcore.settings import Settings
from contextcore.sources.dossier import Fact
from contextcore.sources.dossier_cache import DossierCache, DossierInvalidator
from contextcore.storage import demo_seed, migrations
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.tenancy import TenantDatabase


async def _verify_schema(settings: Settings) -> None:
    conn = await connect(
        settings.require_database_url(), timeout_s=settings.database_connect_timeout_s
    )
    try:
        await migrations.verify(conn)
    finally:
        await conn.close()


async def serve_build(settings: Settings) -> None:
    """Fail closed on a schema mismatch, make sure the topics exist, then consume until a signal."""
    bootstrap = settings.require_bootstrap_servers()
    database_url = settings.require_database_url()
    await _verify_schema(settings)
    await ensure_topics(
        bootstrap, build_topics(settings), timeout_s=settings.kafka_connect_timeout_s
    )
    # Sources read the replica when one is configured; the dossier invalidations are NOTIFYs,
    # which only the primary delivers.
    pool = await create_pool(
        settings.database_read_url or database_url,
        timeout_s=settings.database_connect_timeout_s,
        max_size=settings.database_pool_size,
    )
    cache: DossierCache[list[Fact]] = DossierCache()
    invalidator = DossierInvalidator(cache, database_url)
    try:
        await invalidator.start()
        registry = process_registry(TenantDatabase(pool, role=settings.database_role), cache)
        builder = DefaultContextBuilder(
            registry, ContextPacker(), source_timeout_s=settings.source_timeout_s
        )
        consumer = BuildConsumer(settings, registry=registry, builder=builder)
        serve_metrics(consumer.metrics.registry, settings.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await consumer.broker.start()
        except Exception as error:
            raise InfrastructureUnavailable(f"cannot start the build consumer: {error}") from error
        print(
            f"build consumer ready: topic {settings.topic_build_request}, group "
            f"{settings.build_group_id}, sources {', '.join(registry.names)}, metrics port "
            f"{settings.metrics_port or 'off'}",
            flush=True,
        )
        try:
            await stop.wait()
        finally:
            await consumer.broker.stop()
    finally:
        await invalidator.stop()
        await pool.close()


async def _dev(action: str) -> int:
    stack = DevStack()
    if action == "up":
        report = await stack.up(all_topics(Settings()))
        verb = {True: "started", False: "reused"}
        print(
            f"kafka     {report.addresses.bootstrap_servers}  "
            f"({verb[report.broker_started]}, {report.broker_start_s:.2f} s)"
        )
        print(
            f"postgres  {report.addresses.database_url}  "
            f"({verb[report.postgres_started]}, {report.postgres_start_s:.2f} s)"
        )
        print(f"data      {stack.home}")
    elif action == "down":
        broker, postgres = await asyncio.to_thread(stack.down)
        print(
            f"broker {'stopped' if broker else 'was not running'}; "
            f"postgres {'stopped' if postgres else 'was not running'}"
        )
    elif action == "status":
        broker, postgres = stack.status()
        print(f"broker {'up' if broker else 'down'}; postgres {'up' if postgres else 'down'}")
        return 0 if broker and postgres else 1
    else:
        print(stack.addresses.exports())
    return 0


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


async def _demo(serve: bool) -> int:
    env = dict(os.environ)
    if not (
        os.environ.get("CONTEXTCORE_KAFKA_BOOTSTRAP_SERVERS")
        or os.environ.get("CONTEXTCORE_DATABASE_URL")
    ):
        print("== starting the embedded broker and PostgreSQL")
        await _dev("up")
        addresses = DevStack().addresses
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


def _check_policy(path: Path) -> int:
    """Admission of one policy file: exit 0 when admitted, 1 with the failing path otherwise."""
    try:
        policy = ContextPolicy.model_validate_json(path.read_bytes())
        process_registry().validate_policy(policy)
    except ValidationError as error:
        for line in validation_lines(error):
            print(f"{path}: {line}", file=sys.stderr)
        return 1
    except PolicyError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"{path}: admitted")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="contextcore",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="the embedded broker + PostgreSQL")
    dev.add_argument("action", choices=["up", "down", "status", "env"])
    serve = commands.add_parser("serve", help="run a consumer")
    serve.add_argument("consumer", choices=["build"])
    demo = commands.add_parser("demo", help="start everything and answer one demo request")
    demo.add_argument("--serve", action="store_true", help="keep the consumer running afterwards")
    policy = commands.add_parser("policy", help="check a context policy file")
    policy.add_argument("action", choices=["check"])
    policy.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "policy":
            return _check_policy(args.file)
        if args.command == "dev":
            return asyncio.run(_dev(args.action))
        if args.command == "serve":
            asyncio.run(serve_build(Settings()))
            return 0
        return asyncio.run(_demo(args.serve))
    except SchemaError as error:
        for problem in error.problems:
            print(f"contextcore: refusing to serve: {problem}", file=sys.stderr)
        return 1
    except ContextcoreError as error:
        print(f"contextcore: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
