"""The start journal's coalesced deletes (consumers/runtime/journal.py), as pure logic: the
statements it would send are recorded instead (the integration test runs them on PostgreSQL)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from consumers.runtime.journal import FORGET, PostgresJournal


class Recorded(PostgresJournal):
    """Records each delete; ``down`` fails them as an unanswering database does (fail open);
    ``gate`` holds a delete until set."""

    def __init__(self) -> None:
        super().__init__(None, group="g", forget_delay_s=0.01)  # type: ignore[arg-type]
        self.deletes: list[tuple[str, list[int], list[int]]] = []
        self.down = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()  # a delete began (and may wait on the gate)
        self.sent: asyncio.Queue[int] = asyncio.Queue()  # a delete was recorded

    async def _run(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert sql == FORGET
        self.entered.set()
        await self.gate.wait()
        if self.down:
            self.available = False
            return []
        self.available = True
        _, topic, partitions, offsets = args
        self.deletes.append((topic, partitions, offsets))
        self.sent.put_nowait(len(self.deletes))
        return []


async def test_commits_meanwhile_go_in_one_delete_and_the_newest_wins() -> None:
    journal = Recorded()
    await journal.forget({("t", 0): 5})
    await journal.forget({("t", 0): 9, ("t", 1): 2})
    await journal.forget({("t", 0): 7})
    await journal.close()
    assert journal.deletes == [("t", [0, 1], [9, 2])]


async def test_a_commit_during_a_delete_is_deleted_after_it() -> None:
    journal = Recorded()
    journal.gate.clear()
    await journal.forget({("t", 0): 5})
    await asyncio.wait_for(journal.entered.wait(), 30)  # the batch taken, held by the gate
    await journal.forget({("t", 0): 8})
    journal.gate.set()
    assert await asyncio.wait_for(journal.sent.get(), 30) == 1
    assert await asyncio.wait_for(journal.sent.get(), 30) == 2
    assert journal.deletes == [("t", [0], [5]), ("t", [0], [8])]
    await journal.close()


async def test_what_the_database_did_not_take_waits_for_the_next_delete() -> None:
    journal = Recorded()
    journal.down = True
    await journal.forget({("t", 0): 5})
    await journal.flush()
    assert journal.deletes == []
    journal.down = False
    await journal.close()
    assert journal.deletes == [("t", [0], [5])]


async def test_close_remembers_a_delete_it_cancelled() -> None:
    journal = Recorded()
    journal.gate.clear()
    await journal.forget({("t", 0): 5})
    await asyncio.wait_for(journal.entered.wait(), 30)  # the delete in flight, held by the gate
    closing = asyncio.create_task(journal.close())
    await asyncio.sleep(0)  # close cancels it; its batch is remembered again
    journal.gate.set()
    await closing
    assert journal.deletes == [("t", [0], [5])]
