"""``DocumentsClient``: list and delete the documents of a knowledge scope (an organization's, or
the platform's), for an admin's tools; ``contextcore knowledge documents`` and ``delete`` are
built on it.

It reads and writes through the runtime login (``CONTEXTCORE_DATABASE_URL``) in the scope it is
given, like the services: row security applies, so one organization's client never lists or
deletes another's documents, and an organization's never touches the platform's. A delete is
one transaction: the source, its per-model rows and its chunks go, a deletion record stays
(what, when, which login, at whose request; never the text), and the document has left every
search when :meth:`DocumentsClient.delete` returns. Uploads go through
:class:`~producers.knowledge.KnowledgeClient` (Kafka); a later upload of a deleted document's
uri is a new document.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from uuid import UUID

import asyncpg

from contextcore.knowledge.adapters import admin
from contextcore.knowledge.adapters.admin import Deletion, Document
from contextcore.storage.pool import create_pool
from contextcore.storage.settings import DatabaseSettings
from contextcore.storage.tenancy import Scope, TenantDatabase


class DocumentsClient:
    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, settings: DatabaseSettings | None = None
    ) -> AsyncIterator[DocumentsClient]:
        """A client on its own small pool of the runtime login, closed on exit.

        Raises:
            ConfigurationError: ``CONTEXTCORE_DATABASE_URL`` is not set.
            InfrastructureUnavailable: the database cannot be reached.
        """
        settings = settings or DatabaseSettings()
        pool = await create_pool(
            settings.require_url(), timeout_s=settings.connect_timeout_s, max_size=2
        )
        try:
            yield cls(TenantDatabase(pool, role=settings.role))
        finally:
            await pool.close()

    async def documents(
        self,
        scope: Scope,
        *,
        limit: int = 100,
        after: tuple[datetime, UUID] | None = None,
        status: str | None = None,
    ) -> list[Document]:
        """A page of the scope's documents, newest first (title, status, chunks and model,
        size, uploaded at). The next page: ``after=(last.uploaded_at, last.id)``.

        Raises:
            ValueError: ``limit`` is not 1 to 1,000.
        """
        async with self.database.writing(scope) as tenant:
            return await admin.documents(tenant, limit=limit, after=after, status=status)

    async def delete(
        self,
        scope: Scope,
        source_id: UUID | None = None,
        *,
        identity: str | None = None,
        requested_by: str | None = None,
    ) -> Deletion | None:
        """Delete the scope's document ``source_id``, or the one its uri or object key
        (``identity``) names; ``None`` when the scope has no such document.

        Raises:
            ValueError: neither or both of ``source_id`` and ``identity`` were given, or the
                identity names two documents.
            asyncpg.DeadlockDetectedError: three attempts met an embedding batch in the way.
        """
        if (source_id is None) == (identity is None):
            raise ValueError("name the document by exactly one of its id or its identity")
        for attempt in range(1, 4):
            try:
                async with self.database.writing(scope) as tenant:
                    if identity is not None:
                        source_id = await admin.find_document(tenant, identity)
                        if source_id is None:
                            return None
                    assert source_id is not None
                    return await admin.delete_document(tenant, source_id, requested_by=requested_by)
            except asyncpg.DeadlockDetectedError:
                # an embedding batch of the document held its rows in the other order: the
                # database chose this transaction; the next attempt waits for the batch
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    async def deletions(self, scope: Scope, *, limit: int = 100) -> list[Deletion]:
        """The scope's deleted documents, newest first."""
        async with self.database.writing(scope) as tenant:
            return await admin.deletions(tenant, limit)
