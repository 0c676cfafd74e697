"""The start journal: which records a consumer group started, counted where a restart reads it.

A record's retry count travels in its headers (``records.py``), but a record that kills its
process (a parser that exhausts memory, a native crash, the OOM killer) dies before any count is
written, and its committed offset stays on it: without a count kept outside the process it
crash-loops for ever and stalls its partition. So before a handler runs, the runtime writes the
start here (migration 00016), keyed by group, topic, partition and offset:

1. Every start adds one to ``starts``. A record whose earlier start left no outcome (``starts``
   was already 1 or more) is a *suspect*: it may have killed its process, or merely shared the
   process with the record that did.
2. A suspect runs alone (:class:`~consumers.runtime.gate.SoloGate`): no other record of the
   process runs meanwhile, so if the process dies now, this record killed it. The solo start is
   counted (``solo_starts``) before the handler runs, and given back when it finishes.
3. A suspect that already died alone ``max_crashes`` times is dead-lettered
   (``crashed_the_consumer``) and the partition moves on.

The journal fails open: when PostgreSQL does not answer within ``timeout_s``, the record starts
uncounted (``available`` turns false, so ``/readyz`` says not ready); a build must not stop
because the bookkeeping of crashes is down. Starts of the records that begin together are
written in one statement. Rows below a committed position are deleted at most once every
``forget_delay_s`` (one statement for every commit meanwhile): a row the delete has not reached
yet is below its partition's committed offset, so no delivery reads it, and the first commit of
whichever process holds the partition next deletes it. Its pool's connections are the service
role for their whole session (``create_pool(session_role=...)``), so each of these statements
is one round trip: the start is on every record's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import asyncpg

from consumers.runtime.records import Position
from consumers.runtime.tracker import TopicPartition
from contextcore.storage.tenancy import SERVICE_ROLE, service_role

log = logging.getLogger("contextcore.journal")


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
    async def started(self, position: Position) -> Prior:
        """Count a start of the record at ``position``; what was known before it."""

    async def solo_started(self, position: Position) -> None:
        """Count a start of a suspect running alone."""

    async def solo_finished(self, position: Position) -> None:
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

    async def started(self, position: Position) -> Prior:
        return Prior()

    async def solo_started(self, position: Position) -> None:
        pass

    async def solo_finished(self, position: Position) -> None:
        pass

    async def forget(self, positions: Mapping[TopicPartition, int]) -> None:
        pass


STARTED = """
-- journal.started: count one start of each record; returns the counts including it (an insert
-- is a first start: starts = 1).
INSERT INTO delivery_starts AS d (consumer_group, topic, "partition", "offset")
SELECT $1, $2, r.p, r.o FROM unnest($3::integer[], $4::bigint[]) AS r(p, o)
ON CONFLICT (consumer_group, topic, "partition", "offset") DO UPDATE
SET starts = d.starts + 1, last_started_at = now()
RETURNING "partition", "offset", starts, solo_starts
"""

SOLO = """
-- journal.solo: a suspect starts alone ($5 = 1) or finished alone ($5 = -1).
UPDATE delivery_starts SET solo_starts = greatest(solo_starts + $5, 0), last_started_at = now()
WHERE consumer_group = $1 AND topic = $2 AND "partition" = $3 AND "offset" = $4
"""

FORGET = """
-- journal.forget: the records below each committed position will not be delivered again.
DELETE FROM delivery_starts d
USING unnest($3::integer[], $4::bigint[]) AS c(p, committed)
WHERE d.consumer_group = $1 AND d.topic = $2 AND d."partition" = c.p
  AND d."offset" < c.committed
"""


PRUNE = """
-- journal.prune: rows no commit reached for a long time (a group or a topic that is gone).
DELETE FROM delivery_starts WHERE ctid IN (
    SELECT ctid FROM delivery_starts WHERE last_started_at < now() - $1::interval LIMIT $2
)
"""


async def prune(
    conn: asyncpg.Connection, *, older_than: timedelta, batch: int, role: str = SERVICE_ROLE
) -> int:
    """Delete up to ``batch`` rows last started before ``older_than``; how many went."""
    async with service_role(conn, role=role):
        status: str = await conn.execute(PRUNE, older_than, batch)
    return int(status.rsplit(" ", 1)[-1])


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
        self._queued: dict[Position, asyncio.Future[Prior]] = {}
        self._flush: asyncio.Task[None] | None = None
        self._committed: dict[TopicPartition, int] = {}
        self._forgetting: asyncio.Task[None] | None = None

    async def started(self, position: Position) -> Prior:
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

    async def _counts(self, positions: list[Position]) -> dict[Position, Prior]:
        by_topic: dict[str, list[Position]] = {}
        for position in positions:
            by_topic.setdefault(position.topic, []).append(position)
        known: dict[Position, Prior] = {}
        for topic, in_topic in by_topic.items():
            rows = await self._run(
                STARTED,
                self.group,
                topic,
                [p.partition for p in in_topic],
                [p.offset for p in in_topic],
            )
            for row in rows:
                position = Position(topic, row["partition"], row["offset"])
                known[position] = Prior(row["starts"] - 1, row["solo_starts"])
        return known

    async def solo_started(self, position: Position) -> None:
        await self._solo(position, 1)

    async def solo_finished(self, position: Position) -> None:
        await self._solo(position, -1)

    async def _solo(self, position: Position, change: int) -> None:
        await self._run(
            SOLO, self.group, position.topic, position.partition, position.offset, change
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
