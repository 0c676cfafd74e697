"""``contextcore knowledge``: the knowledge base's admin commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg

from admin.documents import DocumentsClient
from broker.settings import KafkaSettings, TopicSettings
from contextcore.knowledge.adapters import admin, indexes, store
from contextcore.storage.pool import connect, create_pool
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import PLATFORM, Scope, TenantConnection, TenantDatabase
from producers.command import seconds, whole
from producers.knowledge import KnowledgeClient
from schemas.errors import (
    ContextcoreError,
    InfrastructureUnavailable,
    command_parser,
    run_command,
)


class Refused(ContextcoreError):
    """The command may not run now (exit 1)."""


@asynccontextmanager
async def _scope(scope: Scope) -> AsyncIterator[TenantConnection]:
    settings = DatabaseSettings()
    pool = await create_pool(
        settings.require_url(), timeout_s=settings.connect_timeout_s, max_size=1
    )
    try:
        async with TenantDatabase(pool, role=settings.role).writing(scope) as tenant:
            yield tenant
    finally:
        await pool.close()


def _client() -> KnowledgeClient:
    return KnowledgeClient.from_settings(KafkaSettings(), TopicSettings())


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / 1024 / 1024:.1f} MB"


async def _documents(scope: Scope, status: str | None, limit: int, deleted: bool) -> int:
    async with DocumentsClient.connect() as documents:
        if deleted:
            for gone in await documents.deletions(scope, limit=limit):
                by = f" for {gone.requested_by}" if gone.requested_by else ""
                print(
                    f"{gone.source_id}  deleted {gone.deleted_at:%Y-%m-%d %H:%M} by"
                    f" {gone.login}{by}  {gone.chunks} chunk(s)  {gone.title}  [{gone.identity}]"
                )
            return 0
        rows = await documents.documents(scope, limit=limit, status=status)
    for row in rows:
        chunks = "-" if row.chunks is None else str(row.chunks)
        print(
            f"{row.id}  {row.status:7}  {chunks:>6} chunk(s)  {_size(row.size_bytes):>9}"
            f"  {row.uploaded_at:%Y-%m-%d %H:%M}  {row.title}  [{row.identity}]"
        )
    model = rows[0].model if rows else "-"
    print(f"{len(rows)} document(s); chunks counted under the live model {model}")
    return 0


async def _delete(
    scope: Scope, source_id: UUID | None, uri: str | None, by: str | None, apply: bool
) -> int:
    async with _scope(scope) as tenant:
        if uri is not None:
            try:
                source_id = await admin.find_document(tenant, uri)
            except ValueError as error:
                raise Refused(str(error)) from error
        state = None if source_id is None else await store.source(tenant, source_id)
    if state is None or source_id is None:
        raise Refused(f"no document {source_id or uri} in this scope")
    print(f"{source_id}  {state.title}: {state.status}, generation {state.generation}")
    if not apply:
        print("dry run: --apply deletes it, its chunks leave search at once")
        return 0
    async with DocumentsClient.connect() as documents:
        gone = await documents.delete(scope, source_id, requested_by=by)
    if gone is None:
        raise Refused(f"{source_id} was deleted meanwhile")
    print(f"deleted {gone.title} and its {gone.chunks} chunk(s) at {gone.deleted_at:%H:%M:%S}")
    return 0


async def _failed(scope: Scope) -> int:
    async with _scope(scope) as tenant:
        rows = await admin.failed(tenant)
    for row in rows:
        text = "" if row.has_text else "  (no stored text: upload again)"
        print(f"{row.id}  {row.updated_at:%Y-%m-%d %H:%M}  {row.title}  [{row.identity}]{text}")
        print(f"    {row.reason}")
    print(f"{len(rows)} failed source(s)")
    return 0


async def _retry(scope: Scope, source_id: UUID, apply: bool, wait: bool) -> int:
    async with _scope(scope) as tenant:
        state = await store.source(tenant, source_id)
    if state is None:
        raise Refused(f"no source {source_id} in this scope")
    if state.sections is None:
        raise Refused(f"{source_id} has no stored text (its extraction failed): upload it again")
    print(f"{source_id}  {state.title}: {state.status} ({state.status_reason or 'no reason'})")
    if not apply:
        print(f"dry run: --apply ingests generation {state.generation + 1} from the stored text")
        return 0
    organization = state.organization_id
    async with _client() as client:
        status = await client.reingest(organization_id=organization, source_id=source_id, wait=wait)
    print("asked the upload consumer" if status is None else status.model_dump_json(indent=2))
    return 0


async def _prepare(scope: Scope, model: str, dimensions: int, apply: bool) -> int:
    async with _scope(scope) as tenant:
        live, switching = await store.models(tenant)
        sources = await admin.sources_under(tenant, model)
    if live == model:
        raise Refused(f"{model} is already the live model of this scope")
    todo = [s for s in sources if not s.ready and s.status != "failed"]
    print(f"live model {live}; next {switching or 'none'} -> {model}")
    print(f"{len(todo)} of {len(sources)} source(s) to embed under {model}")
    if not apply:
        print("dry run: --apply sets the next model and asks for the embeddings")
        return 0
    settings = DatabaseSettings()
    owner = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
    try:
        await admin.register_model(owner, model, dimensions)
        # the platform's switch moves the organizations that follow it: their sources too
        followers = [] if isinstance(scope, UUID) else await admin.followers_to_embed(owner, model)
    except ValueError as error:
        raise Refused(str(error)) from error
    finally:
        await owner.close()
    async with _scope(scope) as tenant:
        await admin.set_next(tenant, model)
    organization = scope if isinstance(scope, UUID) else None
    async with _client() as client:
        for source in todo:
            await client.reingest(organization_id=organization, source_id=source.id, models=[model])
        for follower, source_id in followers:
            await client.reingest(organization_id=follower, source_id=source_id, models=[model])
    print(
        f"asked for {len(todo) + len(followers)} source(s); follow with:"
        " contextcore knowledge switch status"
    )
    return 0


async def _status(scope: Scope) -> int:
    async with _scope(scope) as tenant:
        live, switching = await store.models(tenant)
        if switching is None:
            print(f"live model {live}; no switch in progress")
            return 0
        sources = await admin.sources_under(tenant, switching)
        following = await admin.followers_not_ready(tenant, switching)
    waiting = [s for s in sources if not s.ready and s.status != "failed"]
    for source in waiting:
        print(f"{source.id}  {source.title}: {source.progress}")
    print(f"live {live}, next {switching}: {len(sources) - len(waiting)} of {len(sources)} ready")
    if following:
        print(f"and {following} source(s) of organizations that follow the platform: not ready")
    return 0 if not waiting and not following else 1


async def _flip(scope: Scope, apply: bool) -> int:
    async with _scope(scope) as tenant:
        live, switching = await store.models(tenant)
        if switching is None:
            raise Refused("no switch in progress: run switch prepare first")
        waiting = [
            s
            for s in await admin.sources_under(tenant, switching)
            if not s.ready and s.status != "failed"
        ]
        if waiting:
            raise Refused(f"{len(waiting)} source(s) are not ready under {switching} yet")
        following = await admin.followers_not_ready(tenant, switching)
        if following:
            raise Refused(
                f"{following} source(s) of organizations that follow the platform's model are"
                f" not ready under {switching} yet"
            )
        if not apply:
            print(f"dry run: --apply makes {switching} the live model instead of {live}")
            return 0
        flipped = await admin.flip(tenant)
    if flipped is None:
        raise Refused("a source stopped being ready under the next model; nothing flipped")
    print(f"the live model is now {flipped}")
    return 0


async def _clean(scope: Scope, apply: bool) -> int:
    async with _scope(scope) as tenant:
        others = await admin.other_models(tenant)
    for model, chunks in others.items():
        print(f"{model}: {chunks} chunk(s)")
    if not apply or not others:
        print("nothing to delete" if not others else "dry run: --apply deletes them in batches")
        return 0
    total = 0
    while True:
        async with _scope(scope) as tenant:
            deleted = await admin.clean_batch(tenant)
        total += deleted
        if deleted == 0:
            break
    print(f"deleted {total} chunk(s)")
    return 0


async def _index(min_chunks: int, apply: bool, every: float | None) -> int:
    settings = DatabaseSettings()
    if every is not None:
        if not apply:
            raise Refused("--every builds indexes: give --apply too")
        return await _index_forever(settings, min_chunks, every)
    conn = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
    try:
        if apply and not await indexes.take_pass_lock(conn):
            print("another index pass is running; this one did nothing")
            return 0
        sizes = await indexes.tenant_sizes(conn)
        for size in sizes:
            tenant = size.organization_id or "platform"
            wanted = size.chunks >= min_chunks
            if size.indexed:
                mark = "indexed" if size.chunks >= min_chunks // 2 else "indexed, to drop"
            else:
                mark = "to index" if wanted else "exact"
            print(f"{tenant}  {size.model}  {size.chunks} chunks  {mark}")
        if not apply:
            for name in await indexes.unneeded(conn, sizes, min_chunks):
                print(f"{name}  to drop (its tenant left or shrank)")
        else:
            for size in await indexes.build_missing(conn, sizes, min_chunks):
                print(f"    built {size.index} ({size.organization_id or 'platform'})")
            for name in await indexes.drop_unneeded(conn, sizes, min_chunks):
                print(f"    dropped {name} (its tenant left or shrank)")
    finally:
        await conn.close()
    if not apply:
        print(
            f"dry run: --apply builds an HNSW index for each tenant of {min_chunks}+ chunks and"
            f" drops those of tenants gone or below {min_chunks // 2}"
        )
    return 0


async def _index_pass(conn: asyncpg.Connection, min_chunks: int) -> None:
    sizes = await indexes.tenant_sizes(conn)
    for size in await indexes.build_missing(conn, sizes, min_chunks):
        print(
            f"built {size.index} ({size.organization_id or 'platform'}, {size.chunks} chunks)",
            flush=True,
        )
    for name in await indexes.drop_unneeded(conn, sizes, min_chunks):
        print(f"dropped {name} (its tenant left or shrank)", flush=True)


async def _index_forever(settings: DatabaseSettings, min_chunks: int, every: float) -> int:
    """The indexer job: a pass every ``every`` seconds until SIGTERM or SIGINT; a pass that
    fails (the database restarting, say) is logged and the next one tries again; a login the
    database refuses for good ends the job (exit 2: no pass will ever connect)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"indexing tenants of {min_chunks}+ chunks every {every:g} s", flush=True)
    while not stop.is_set():
        try:
            conn = await connect(settings.require_owner_url(), timeout_s=settings.connect_timeout_s)
            try:
                if await indexes.take_pass_lock(conn):
                    await _index_pass(conn, min_chunks)
                else:
                    print("another index pass is running; this one skipped", flush=True)
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError, InfrastructureUnavailable) as error:
            print(
                f"index pass failed ({type(error).__name__}: {error}); next in {every:g} s",
                flush=True,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
    return 0


def _settings_first(args: argparse.Namespace) -> None:
    """Read every setting the command will use before it connects to anything: a setting
    missing or malformed exits 2 however the database would have answered (retry and switch
    prepare read the database before they ask the upload consumer over Kafka)."""
    database = DatabaseSettings()
    if args.command == "index":
        database.require_owner_url()
        return
    database.require_url()
    prepare = args.command == "switch" and args.step == "prepare"
    if (prepare or args.command == "retry") and args.apply:  # they ask the upload consumer
        KafkaSettings().require_bootstrap_servers()
        TopicSettings()
        if prepare:  # and register the model in the global catalog
            database.require_owner_url()


def _scope_of(args: argparse.Namespace) -> Scope:
    return PLATFORM if args.platform else UUID(str(args.organization))


MAX_DIMENSIONS = 16_000
"""The most dimensions ``--dimensions`` takes: the model catalog's CHECK (migration 00007)."""


KNOWLEDGE = """The knowledge base's admin commands. Each that changes data is a dry run unless
given --apply: it prints what it would do.

  documents (scope) [--status S] [--limit N] [--deleted]
                            the scope's documents, newest first: status, chunks, model,
                            size, uploaded at
  delete (SOURCE | --uri URI) (scope) [--by NAME] [--apply]
                            delete a document and its chunks
  failed (scope)            failed sources, with the reasons
  retry SOURCE (scope) [--apply] [--wait]
                            ingest a failed source again from its stored text
  switch prepare MODEL --dimensions N (scope) [--apply]
                            model switch, step 1: embed every source under MODEL
  switch status (scope)     step 2: what is not ready under it yet
  switch flip (scope) [--apply]
                            step 3: make it the live model
  switch clean (scope) [--apply]
                            step 4: delete the other models' rows
  index [--min-chunks N] [--apply] [--every SECONDS]
                            per-tenant HNSW indexes, as the schema owner; --every: a pass
                            every SECONDS, until stopped (the job's mode)

  (scope) is --organization ID or --platform.

The data commands use the runtime login (CONTEXTCORE_DATABASE_URL) in the named scope, so row
security applies to them as to the services; retry and switch prepare ask the upload consumer
over Kafka; index and switch prepare --apply (which registers the model in the global catalog)
need the schema owner (CONTEXTCORE_DATABASE_OWNER_URL). A command refused (out of order, not
found) exits 1."""


def main(argv: list[str] | None = None) -> int:
    """Documents, failed sources, the model switch, indexes (admin)."""
    args = parser().parse_args(argv)

    def run() -> int:
        _settings_first(args)
        if args.command == "index":
            return asyncio.run(_index(args.min_chunks, args.apply, args.every))
        scope = _scope_of(args)
        if args.command == "documents":
            return asyncio.run(_documents(scope, args.status, args.limit, args.deleted))
        if args.command == "delete":
            return asyncio.run(_delete(scope, args.source, args.uri, args.by, args.apply))
        if args.command == "failed":
            return asyncio.run(_failed(scope))
        if args.command == "retry":
            return asyncio.run(_retry(scope, args.source, args.apply, args.wait))
        if args.step == "prepare":
            return asyncio.run(_prepare(scope, args.model, args.dimensions, args.apply))
        if args.step == "status":
            return asyncio.run(_status(scope))
        if args.step == "flip":
            return asyncio.run(_flip(scope, args.apply))
        return asyncio.run(_clean(scope, args.apply))

    return run_command(
        "contextcore knowledge", run, expected=(OSError, ValueError, asyncpg.PostgresError)
    )


def _scoped(command: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command on one scope: an organization's, or the platform's."""
    group = command.add_mutually_exclusive_group(required=True)
    group.add_argument("--organization", type=UUID)
    group.add_argument("--platform", action="store_true")
    return command


def parser() -> argparse.ArgumentParser:
    """``contextcore knowledge``'s commands and their arguments."""
    parser = command_parser(
        "knowledge",
        KNOWLEDGE,
        "contextcore knowledge documents --organization 7b000000-0000-4000-8000-0000000000a1",
        "contextcore knowledge index --apply",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    documents = _scoped(commands.add_parser("documents", help="the scope's documents"))
    documents.add_argument("--status", choices=("pending", "ready", "failed"))
    documents.add_argument("--limit", type=whole(1, admin.MAX_PAGE), default=100)
    documents.add_argument("--deleted", action="store_true", help="the deleted ones instead")
    delete = _scoped(commands.add_parser("delete", help="delete a document and its chunks"))
    named = delete.add_mutually_exclusive_group(required=True)
    named.add_argument("source", type=UUID, nargs="?")
    named.add_argument("--uri", help="the document's uri or object key")
    delete.add_argument("--by", help="who asked (kept in the deletion record)")
    delete.add_argument("--apply", action="store_true")
    _scoped(commands.add_parser("failed", help="failed sources with reasons"))
    retry = _scoped(commands.add_parser("retry", help="ingest a source again"))
    retry.add_argument("source", type=UUID)
    retry.add_argument("--apply", action="store_true")
    retry.add_argument("--wait", action="store_true", help="wait for its final status")
    _switch_steps(commands.add_parser("switch", help="the model switch, step by step"))
    index = commands.add_parser("index", help="per-tenant HNSW indexes (schema owner)")
    index.add_argument("--min-chunks", type=whole(0), default=indexes.MIN_CHUNKS)
    index.add_argument("--apply", action="store_true")
    index.add_argument("--every", type=seconds, help="seconds between passes, until stopped")
    return parser


def _switch_steps(switch: argparse.ArgumentParser) -> None:
    steps = switch.add_subparsers(dest="step", required=True)
    prepare = _scoped(steps.add_parser("prepare"))
    prepare.add_argument("model")
    prepare.add_argument("--dimensions", type=whole(1, MAX_DIMENSIONS), required=True)
    prepare.add_argument("--apply", action="store_true")
    _scoped(steps.add_parser("status"))
    _scoped(steps.add_parser("flip")).add_argument("--apply", action="store_true")
    _scoped(steps.add_parser("clean")).add_argument("--apply", action="store_true")


if __name__ == "__main__":
    sys.exit(main())
