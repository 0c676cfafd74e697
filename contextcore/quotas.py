"""Quotas an operator sets per organization (migration 00038; docs/operations.md, "Quotas").

One place holds them, the ``organization_quotas`` table: a row per organization with quotas of
its own and one default row for every organization; ``contextcore quota`` writes them
(admin/quotas.py), and contextcore/storage/quotas.py reads them. Each quota is the
organization's own value or the default's, ``None`` where neither has one: no limit, the
default everywhere.

Where each is enforced, and what the caller hears (every answer names the quota):

================== ============================================== ===========================
quota              enforced by                                    over it
================== ============================================== ===========================
build_rate, _burst the build consumer (per process, a token        ``throttled``, with
                   bucket: contextcore/throttle.py)               ``retry_after_ms``
uploads_in_flight  the upload's first transaction, under the      ``rejected``: nothing stored
                   organization's quota lock
chunks_per_document the cut (the sandbox stops at it)             the source ``failed``, no
                                                                  chunk stored
stored_chunks      the transaction that records the chunk count,  the source ``failed``, no
                   under the organization's quota lock            chunk stored
memory_revisions   ``memory_apply`` (in SQL)                      ``refused``, reason ``quota``
================== ============================================== ===========================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID


@dataclass(frozen=True)
class Quotas:
    """The quotas in force for one organization; ``None``: no limit."""

    build_rate: float | None = None
    build_burst: int | None = None
    uploads_in_flight: int | None = None
    chunks_per_document: int | None = None
    stored_chunks: int | None = None
    memory_revisions: int | None = None

    @classmethod
    def of(cls, row: Any) -> Quotas:
        return cls(**{name: row[name] for name in NAMES})


NAMES = (
    "build_rate",
    "build_burst",
    "uploads_in_flight",
    "chunks_per_document",
    "stored_chunks",
    "memory_revisions",
)
"""The quotas, by their column names (the names every refusal uses)."""

NO_QUOTAS = Quotas()


class QuotaReader(Protocol):
    """Where a consumer reads an organization's quotas
    (:class:`~contextcore.storage.quotas.DatabaseQuotas`)."""

    async def quotas(self, organization_id: UUID) -> Quotas: ...
