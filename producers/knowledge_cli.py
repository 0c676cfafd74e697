"""``contextcore-upload FILE (--organization ID | --platform)``: upload a document, wait for it.

Prints the final status as JSON. Exit status (``contextcore.errors.exit_code``): 0 when the
source is ready; 1 when it was rejected, failed or superseded by a later upload of the same
document (the reason is printed); 2 when the broker is unreachable or no final status came in
time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from uuid import UUID

from broker.settings import KafkaSettings, TopicSettings
from contextcore.errors import run_command
from producers.knowledge import KnowledgeClient


async def _upload(args: argparse.Namespace) -> int:
    async with KnowledgeClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        status = await client.upload_file(
            args.file,
            organization_id=args.organization,
            title=args.title,
            media_type=args.media_type,
            uri=args.uri,
            timeout=args.timeout,
        )
    print(status.model_dump_json(indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextcore-upload", description=__doc__)
    parser.add_argument("file", type=Path)
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--organization", type=UUID, help="the organization's id")
    scope.add_argument("--platform", action="store_true", help="shared platform documentation")
    parser.add_argument("--title", help="default: the file name without its suffix")
    parser.add_argument("--media-type", help="default: from the suffix (.txt .md .html .pdf)")
    parser.add_argument("--uri", help="the source's identity (default: the file's URI)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (300)")
    args = parser.parse_args(argv)
    return run_command(
        "contextcore-upload", lambda: asyncio.run(_upload(args)), expected=(OSError, ValueError)
    )


if __name__ == "__main__":
    sys.exit(main())
