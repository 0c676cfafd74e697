"""The start journal: which records a consumer group started, counted where a restart reads it.

A record's retry count travels in its headers (``records.py``), but a record that kills its
process (a parser that exhausts memory, a native crash, the OOM killer) dies before any count is
written, and its committed offset stays on it: without a count kept outside the process it
crash-loops for ever and stalls its partition. So before a handler runs, the runtime writes the
start here (migrations 00016, 00036), keyed by group, topic, partition and offset, and bound to
the record's content by its digest (:func:`record_digest`):

1. Every start adds one to ``starts``. A record whose earlier start left no outcome (``starts``
   was already 1 or more) is a *suspect*: it may have killed its process, or merely shared the
   process with the record that did.
2. A suspect runs alone (:class:`~consumers.runtime.gate.SoloGate`): no other record of the
   process runs meanwhile, so if the process dies now, this record killed it. The solo start is
   counted (``solo_starts``) before the handler runs, and given back when it finishes.
3. A suspect that already died alone ``max_crashes`` times is dead-lettered
   (``crashed_the_consumer``) and the partition moves on.

A row counts for a record only while it holds that record's digest: a start of other bytes at
its position resets it (a first start), and a solo start or finish of other bytes changes
nothing. So a row written before its record existed (the runtime login could plant any, issue
32) can neither make the record a suspect nor count crashes for it: nobody knew its bytes yet.
The runtime login reaches the table only through narrow functions (migration 00036) and cannot
read it, so it cannot learn the digests of the records in flight either. What it can still do
is delete or reset rows, which only lets a record that took its process down run again: the
direction the journal fails in anyway.

The journal fails open: when PostgreSQL does not answer within ``timeout_s``, the record starts
uncounted (``available`` turns false, so ``/readyz`` says not ready); a build must not stop
because the bookkeeping of crashes is down. Starts of the records that begin together are
written in one statement per topic. Rows below a committed position are deleted at most once every
``forget_delay_s`` (one statement for every commit meanwhile): a row the delete has not reached
yet is below its partition's committed offset, so no delivery reads it, and the first commit of
whichever process holds the partition next deletes it. Its pool's connections are the service
role for their whole session (``create_pool(session_role=...)``), so each of these statements
is one round trip: the start is on every record's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import asyncpg

from consumers.runtime.records import Inbound, Position
from consumers.runtime.tracker import TopicPartition
from contextcore.storage.tenancy import SERVICE_ROLE, service_role

log = logging.getLogger("contextcore.journal")


def record_digest(key: bytes | None, value: bytes | None) -> bytes:
    """sha256 over a record's key and value, each framed as absent (``00``) or present (``01``,
    its length in 8 bytes, its bytes): no two (key, value) pairs frame alike, so no bytes moved
    from one part to the other, nor a missing key taken for an empty one, give another's digest.
    """
    h = hashlib.sha256()
    for part in (key, value):
        if part is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01" + len(part).to_bytes(8, "big"))
            h.update(part)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Start(Position):
    """A record's position and the digest of its key and value: what the journal counts a start
    of. A :class:`Position` (it prints as one), so a port that counts by position alone still
    takes it."""

    digest: bytes

    @classmethod
    def of(cls, record: Inbound) -> Start:
        digest = record_digest(record.key, record.value)
        return cls(record.topic, record.partition, record.offset, digest)

    @property
    def position(self) -> Position:
        return Position(self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class Prior:
    """What the journal knew of a record before this start."""

    starts: int = 0
    """Starts before this one that did not end in a commit past the record."""
    solo_crashes: int = 0
    """Solo starts that did not finish: times it very likely took its process down."""

    @property
    def suspect(self) -> bool:
        return self.starts > 0


class StartJournal(Protocol):
    """A record is named by its :class:`Start`: what is known at its position counts for it only
    when it was counted for the same digest."""

    async def started(self, position: Start) -> Prior:
        """Count a start of the record; what was known of it before."""

    async def solo_started(self, position: Start) -> None:
        """Count a start of a suspect running alone."""

    async def solo_finished(self, position: Start) -> None:
        """Take back the solo start of a suspect that reached its outcome."""

    async def forget(self, positions: Mapping[TopicPartition, int]) -> None:
        """Drop what is known of records below each committed position."""


class ServedJournal(StartJournal, Protocol):
    """The journal a consumer's process serves with: its availability is its readiness."""

    @property
    def available(self) -> bool:
        """Whether the last statement was answered."""

    async def check(self) -> bool:
        """Whether the journal answers now (the readiness probe asks every few seconds)."""


class NoJournal:
    """Counts nothing: every record is a first start (a process with no database)."""

    available = True

    async def check(self) -> bool:
        return True

    async def started(self, position: Start) -> Prior:
        return Prior()

    async def solo_started(self, position: Start) -> None:
        pass

    async def solo_finished(self, position: Start) -> None:
        pass

    async def forget(self, positions: Mapping[TopicPartition, int]) -> None:
        pass


# Each statement calls a function of migration 00036, the service role's only way to
# delivery_starts; the rules (a row counts for one digest only, what a NULL does) live there.

STARTED = """
-- journal.started: count one start of each record of one topic ($3, $4: positions; $5: their
-- digests); the counts including it. A row of another digest was reset: a first start.
SELECT "partition", "offset", starts, solo_starts
FROM contextcore_journal_started($1, $2, $3::integer[], $4::bigint[], $5::bytea[])
"""

SOLO = """
-- journal.solo: a suspect starts alone ($6 = 1) or finished alone ($6 = -1), on the row of its
-- digest ($5) only.
SELECT contextcore_journal_solo($1, $2, $3, $4, $5, $6)
"""

FORGET = """
-- journal.forget: the records below each committed position will not be delivered again.
SELECT contextcore_journal_forget($1, $2, $3::integer[], $4::bigint[])
"""

PRUNE = """
-- journal.prune: rows no start touched for a long time (a group or a topic that is gone).
SELECT contextcore_journal_prune($1::interval, $2)
"""

STARTS_PER_STATEMENT = 10_000
"""The most starts the function takes in one call (``max_in_flight`` is at most as many; with
the ``quiet_slots`` beside them, the rest go in a second call)."""


async def prune(
    conn: asyncpg.Connection, *, older_than: timedelta, batch: int, role: str = SERVICE_ROLE
) -> int:
    """Delete up to ``batch`` rows last started before ``older_than``; how many went."""
    async with service_role(conn, role=role):
        removed: int = await conn.fetchval(PRUNE, older_than, batch)
    return removed


class PostgresJournal:
    """The journal in ``delivery_starts``, through a small pool of its own (so a handler that
    holds every connection of its pool never delays a start), opened with
    ``create_pool(session_role=<the service role>)``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        group: str,
        timeout_s: float = 2.0,
        forget_delay_s: float = 1.0,
    ) -> None:
        self.pool = pool
        self.group = group
        self.timeout_s = timeout_s
        self.forget_delay_s = forget_delay_s
        self.available = True
        self._queued: dict[Start, asyncio.Future[Prior]] = {}
        self._flush: asyncio.Task[None] | None = None
        self._committed: dict[TopicPartition, int] = {}
        self._forgetting: asyncio.Task[None] | None = None

    async def started(self, position: Start) -> Prior:
        future = self._queued.get(position)
        if future is None:
            future = self._queued[position] = asyncio.get_running_loop().create_future()
            if self._flush is None or self._flush.done():
                self._flush = asyncio.create_task(self._write_starts())
        return await asyncio.shield(future)

    async def _write_starts(self) -> None:
        """One statement per topic for every start queued meanwhile (group commit), until no
        start waits. A future is always resolved: an error of ours counts nothing."""
        await asyncio.sleep(0)  # let the records that begin together queue their starts
        while self._queued:
            batch, self._queued = self._queued, {}
            try:
                known = await self._counts(list(batch))
            except BaseException:
                for future in batch.values():
                    if not future.done():
                        future.set_result(Prior())
                raise
            for position, future in batch.items():
                if not future.done():
                    future.set_result(known.get(position, Prior()))

    async def _counts(self, starts: list[Start]) -> dict[Start, Prior]:
        by_topic: dict[str, list[Start]] = {}
        for start in starts:
            by_topic.setdefault(start.topic, []).append(start)
        known: dict[Start, Prior] = {}
        for topic, in_topic in by_topic.items():
            for first in range(0, len(in_topic), STARTS_PER_STATEMENT):
                chunk = in_topic[first : first + STARTS_PER_STATEMENT]
                rows = await self._run(
                    STARTED,
                    self.group,
                    topic,
                    [s.partition for s in chunk],
                    [s.offset for s in chunk],
                    [s.digest for s in chunk],
                )
                at = {(s.partition, s.offset): s for s in chunk}
                for row in rows:  # each row holds its start's digest now
                    start = at[row["partition"], row["offset"]]
                    known[start] = Prior(row["starts"] - 1, row["solo_starts"])
        return known

    async def solo_started(self, position: Start) -> None:
        await self._solo(position, 1)

    async def solo_finished(self, position: Start) -> None:
        await self._solo(position, -1)

    async def _solo(self, start: Start, change: int) -> None:
        await self._run(
            SOLO, self.group, start.topic, start.partition, start.offset, start.digest, change
        )

    async def forget(self, positions: Mapping[TopicPartition, int]) -> None:
        """Remember the committed positions; their delete follows within ``forget_delay_s``."""
        self._remember(positions)
        if self._forgetting is None or self._forgetting.done():
            self._forgetting = asyncio.create_task(self._forget_later())

    def _remember(self, positions: Mapping[TopicPartition, int]) -> None:
        for partition, committed in positions.items():
            if committed > self._committed.get(partition, -1):  # never undo a newer commit
                self._committed[partition] = committed

    async def _forget_later(self) -> None:
        """Until nothing waits: a delay, then one delete for all that was remembered meanwhile
        (a commit remembered during a delete goes with the next)."""
        while self._committed:
            await asyncio.sleep(self.forget_delay_s)
            await self.flush()

    async def flush(self) -> None:
        """Delete now the rows below every committed position remembered so far. What the
        database did not take (it did not answer, or the delete was cancelled) is remembered
        again for the next delete."""
        committed, self._committed = self._committed, {}
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for (topic, partition), position in committed.items():
            by_topic.setdefault(topic, []).append((partition, position))
        deleted: set[str] = set()
        try:
            for topic, pairs in by_topic.items():
                await self._run(
                    FORGET, self.group, topic, [p for p, _ in pairs], [c for _, c in pairs]
                )
                if self.available:  # _run fails open: no rows, and not available
                    deleted.add(topic)
        finally:
            self._remember({tp: c for tp, c in committed.items() if tp[0] not in deleted})

    async def close(self) -> None:
        """Write the deletes still waiting (a stopping member commits last)."""
        task = self._forgetting
        if task is not None and not task.done():
            task.cancel()  # a delete it was sending is remembered again (flush)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()

    async def check(self) -> bool:
        """Whether the database answers now (the readiness probe asks every few seconds)."""
        await self._run("SELECT 1")
        return self.available

    async def _run(self, sql: str, *args: object) -> list[asyncpg.Record]:
        """The rows of one statement (its own transaction); none, and ``available`` false,
        when the database does not answer in time: the journal fails open."""
        try:
            async with asyncio.timeout(self.timeout_s), self.pool.acquire() as conn:
                try:
                    rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
                except BaseException:
                    if not conn.is_closed():
                        conn.terminate()  # whatever state it is in, it is not reused
                    raise
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            if self.available:
                log.warning("the start journal is unavailable: %s", type(error).__name__)
            self.available = False
            return []
        self.available = True
        return rows
