"""``contextcore build``: publish one build request, print the reply."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from broker.settings import KafkaSettings, TopicSettings
from producers.client import ContextClient
from producers.command import seconds
from producers.explain import explain
from schemas.build import BuildRequestV1, parse_build_request
from schemas.errors import command_parser, run_command


async def _send(envelope: BuildRequestV1, timeout: float, *, explained: bool, as_json: bool) -> int:
    async with ContextClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        reply = await client.request(
            envelope.request,
            envelope.policy,
            timeout=timeout,
            explain=explained,
            read_after=envelope.read_after,
        )
    if explained and not as_json and reply.brief is not None and reply.manifest is not None:
        print(explain(reply.brief, reply.manifest))
    else:
        print(reply.model_dump_json(indent=2))
    return 0 if reply.status == "ok" else 1


def _read(request_path: Path, policy_path: Path, read_after: str | None = None) -> BuildRequestV1:
    """The files as the consumer would read them (malformed entities dropped)."""
    envelope, _ = parse_build_request(
        {
            "correlation_id": "cli",
            "reply_to": "cli",
            "request": json.loads(request_path.read_text()),
            "policy": json.loads(policy_path.read_text()),
            "read_after": read_after,
        }
    )
    return envelope


BUILD = """Publish one build request and print the reply as JSON.

  REQUEST.json    a ContextRequest: subject, query, entities, conversation
  POLICY.json     a ContextPolicy: the sources, their budgets, the total budget

The files are read as the build consumer reads them (malformed entities are dropped).

With --explain the consumer also answers why each item is in the brief or not, and this prints
the brief, then a table: the kept items, the dropped ones by reason (source_not_enabled,
lost_key_to:<source>:<ref>, over_source_budget, over_total_budget), then the failed sources
with their cause. --json prints the whole reply, the manifest included, instead."""


def main(argv: list[str] | None = None) -> int:
    """Publish one build request and print the reply."""
    parser = command_parser("build", BUILD, "contextcore build request.json policy.json --explain")
    parser.add_argument("request", type=Path, help="a ContextRequest as JSON")
    parser.add_argument("policy", type=Path, help="a ContextPolicy as JSON")
    parser.add_argument("--timeout", type=seconds, default=10.0, help="seconds to wait (10)")
    parser.add_argument(
        "--explain", action="store_true", help="print the brief and why each item is in it or not"
    )
    parser.add_argument("--json", action="store_true", help="with --explain: the reply as JSON")
    parser.add_argument(
        "--read-after",
        metavar="POSITION",
        help="read a write this position names (a memory answer's or a ready status's)",
    )
    args = parser.parse_args(argv)

    def send() -> int:
        envelope = _read(args.request, args.policy, args.read_after)
        return asyncio.run(_send(envelope, args.timeout, explained=args.explain, as_json=args.json))

    return run_command(
        "contextcore build",
        send,
        expected=(OSError, ValueError),
    )


if __name__ == "__main__":
    sys.exit(main())
