"""``contextcore upload``: upload a document and wait for its final status."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from uuid import UUID

from broker.settings import KafkaSettings, TopicSettings
from producers.command import seconds
from producers.knowledge import KnowledgeClient
from producers.staging import FileStage, S3Stage, Stage
from schemas.errors import command_parser, run_command


async def _upload(args: argparse.Namespace) -> int:
    stage: Stage | None = None
    if args.stage_dir is not None:
        stage = FileStage(args.stage_dir, args.stage_root)
    elif args.stage_s3 is not None:
        stage = S3Stage(args.stage_s3, args.s3_endpoint, args.s3_region)
    async with KnowledgeClient.from_settings(KafkaSettings(), TopicSettings()) as client:
        status = await client.upload_file(
            args.file,
            organization_id=args.organization,
            title=args.title,
            media_type=args.media_type,
            uri=args.uri,
            stage=stage,
            timeout=args.timeout,
        )
    print(status.model_dump_json(indent=2))
    return 0


UPLOAD = """Upload a document to an organization's knowledge (or the platform's), wait until it
is searchable, and print its final status as JSON.

A file that does not fit one record (about 675 KB) goes by reference:
  --stage-dir DIR     the upload consumer's file root, shared with this machine
                      (--stage-root names it as the consumer sees it)
  --stage-s3 BUCKET   a bucket the consumer reads (credentials from the environment,
                      --s3-endpoint for an S3-compatible server)
Without either, such a file is refused before anything is sent.

Exits 0 when the source is ready; 1 when it was rejected, failed, or superseded by a later
upload of the same document (the reason is printed)."""


def main(argv: list[str] | None = None) -> int:
    """Upload a document and wait until it is searchable."""
    parser = command_parser(
        "upload",
        UPLOAD,
        "contextcore upload guide.md --organization 7b000000-0000-4000-8000-0000000000a1",
        "contextcore upload handbook.pdf --platform --stage-dir /srv/uploads",
    )
    parser.add_argument("file", type=Path)
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--organization", type=UUID, help="the organization's id")
    scope.add_argument("--platform", action="store_true", help="shared platform documentation")
    parser.add_argument("--title", help="default: the file name without its suffix")
    parser.add_argument("--media-type", help="default: from the suffix (.txt .md .html .pdf)")
    parser.add_argument("--uri", help="the source's identity (default: the file's URI)")
    parser.add_argument("--timeout", type=seconds, default=300.0, help="seconds to wait (300)")
    staged = parser.add_mutually_exclusive_group()
    staged.add_argument("--stage-dir", type=Path, help="the upload consumer's file root, here")
    staged.add_argument("--stage-s3", metavar="BUCKET", help="a bucket the consumer reads")
    parser.add_argument("--stage-root", help="--stage-dir as the consumer sees it (its path)")
    parser.add_argument("--s3-endpoint", help="an S3-compatible server's URL")
    parser.add_argument("--s3-region")
    args = parser.parse_args(argv)
    return run_command(
        "contextcore upload", lambda: asyncio.run(_upload(args)), expected=(OSError, ValueError)
    )


if __name__ == "__main__":
    sys.exit(main())
