"""``contextcore build``: publish one build request, print the reply."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from broker.settings import KafkaSettings, TopicSettings
from producers.client import ContextClient
from schemas.build import BuildRequestV1, parse_build_request
from schemas.errors import command_parser, run_command


async def _send(envelope: BuildRequestV1, timeout: float) -> int:
    async with ContextClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        reply = await client.request(envelope.request, envelope.policy, timeout=timeout)
    print(reply.model_dump_json(indent=2))
    return 0 if reply.status == "ok" else 1


def _read(request_path: Path, policy_path: Path) -> BuildRequestV1:
    """The files as the consumer would read them (malformed entities dropped)."""
    envelope, _ = parse_build_request(
        {
            "correlation_id": "cli",
            "reply_to": "cli",
            "request": json.loads(request_path.read_text()),
            "policy": json.loads(policy_path.read_text()),
        }
    )
    return envelope


BUILD = """Publish one build request and print the reply as JSON.

  REQUEST.json    a ContextRequest: subject, query, entities, conversation
  POLICY.json     a ContextPolicy: the sources, their budgets, the total budget

The files are read as the build consumer reads them (malformed entities are dropped)."""


def main(argv: list[str] | None = None) -> int:
    """Publish one build request and print the reply."""
    parser = command_parser("build", BUILD, "contextcore build request.json policy.json")
    parser.add_argument("request", type=Path, help="a ContextRequest as JSON")
    parser.add_argument("policy", type=Path, help="a ContextPolicy as JSON")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (10)")
    args = parser.parse_args(argv)
    return run_command(
        "contextcore build",
        lambda: asyncio.run(_send(_read(args.request, args.policy), args.timeout)),
        expected=(OSError, ValueError),
    )


if __name__ == "__main__":
    sys.exit(main())
