"""``contextcore dev``: the embedded dev stack and the demo (a checkout of the repository)."""

from __future__ import annotations

import asyncio
import logging
import sys

from broker.settings import KafkaSettings, TopicSettings
from broker.topics import all_topics
from consumers.build.settings import BuildSettings
from consumers.knowledge.embed.settings import EmbedSettings
from consumers.knowledge.upload.settings import UploadSettings
from consumers.memory.settings import MemorySettings
from contextcore.knowledge.adapters.settings import KnowledgeSettings
from contextcore.storage.settings import DatabaseSettings
from devstack.demo import run_demo
from devstack.stack import DevSettings, DevStack
from schemas.errors import command_parser, run_command

DEMO_SETTINGS = (
    DevSettings,
    KafkaSettings,
    TopicSettings,
    DatabaseSettings,
    KnowledgeSettings,
    BuildSettings,
    UploadSettings,
    EmbedSettings,
    MemorySettings,
)
"""What the demo and the four consumers it starts read: each group is read before the demo
starts or connects to anything, so a malformed setting exits 2 at once, not once the stack is
up, or when a consumer has stopped on it and the demo waits for an answer that never comes."""


async def _demo(serve: bool) -> int:
    for group in DEMO_SETTINGS:
        group()
    return await run_demo(serve)


async def _stack(action: str, durable: bool, replica: bool) -> int:
    stack = DevStack(DevSettings(durable=True) if durable else None)
    if action == "up":
        report = await stack.up(all_topics(TopicSettings()), replica=replica)
        print("\n".join(report.lines(stack.home)))
    elif action == "down":
        s3 = stack.s3_running()
        standing = await asyncio.to_thread(stack.replica.running)
        broker, postgres = await asyncio.to_thread(stack.down)
        print(
            f"broker {'stopped' if broker else 'was not running'}"
            f"{' (and its S3 server, with the data)' if s3 else ''}; "
            f"postgres {'stopped' if postgres else 'was not running'}"
            f"{' (and its standby)' if standing else ''}"
        )
    elif action == "status":
        broker, postgres = stack.status()
        storage = stack.broker_storage()
        described = f", {storage.describe()}" if broker and storage else ""
        standby = "; standby up" if stack.replica.running() else ""
        print(
            f"broker {'up' if broker else 'down'}{described}; "
            f"postgres {'up' if postgres else 'down'}{standby}"
        )
        return 0 if broker and postgres else 1
    else:
        print(stack.addresses.exports())
    return 0


DEV = """The embedded dev stack (Tansu broker + PostgreSQL on 127.0.0.1) and the demo.

  up [--durable] [--replica]
                    start the broker and PostgreSQL (and a hot standby of it)
  down              stop them (and the local S3 server, with its data; the standby)
  status            say whether each runs (exits 1 unless both do)
  env               print the exports of the four addresses: the broker, the runtime login,
                    the schema owner, the cluster's administrator (dev only)
  demo [--serve]    the main job end to end on the embedded default

up --durable (or CONTEXTCORE_DEV_DURABLE=true) runs the broker on Tansu's s3:// storage against
a local S3 server, so a broker restart keeps topics, acknowledged records and committed
offsets. up --replica also starts a hot standby of PostgreSQL (a base backup, then streaming
replication) on 127.0.0.1:15433 and prints its URL for CONTEXTCORE_DATABASE_READ_URL."""


def main(argv: list[str] | None = None) -> int:
    """The embedded broker and PostgreSQL, and the demo (development only)."""
    parser = command_parser("dev", DEV, "contextcore dev up", 'eval "$(contextcore dev env)"')
    parser.add_argument("action", choices=["up", "down", "status", "env", "demo"])
    parser.add_argument("--serve", action="store_true", help="demo: keep the consumer running")
    parser.add_argument(
        "--durable",
        action="store_true",
        help="up: the broker keeps its data across restarts (s3:// storage on a local S3 server)",
    )
    parser.add_argument(
        "--replica",
        action="store_true",
        help="up: also a hot standby of PostgreSQL, streaming from it (devstack/replica.py)",
    )
    args = parser.parse_args(argv)
    if args.durable and args.action != "up":
        parser.error("--durable goes with up (CONTEXTCORE_DEV_DURABLE=true for the demo)")
    if args.replica and args.action != "up":
        parser.error("--replica goes with up")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.action == "demo":
        return run_command("contextcore dev", lambda: asyncio.run(_demo(args.serve)))
    return run_command(
        "contextcore dev", lambda: asyncio.run(_stack(args.action, args.durable, args.replica))
    )


if __name__ == "__main__":
    sys.exit(main())
