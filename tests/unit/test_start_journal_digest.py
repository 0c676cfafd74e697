"""A start-journal row counts only for the record whose bytes it was counted for (issue 32): the
digest's framing, and the in-memory journal's rule (tests/integration/test_start_journal.py
holds PostgreSQL's to the same)."""

from __future__ import annotations

import hashlib

from consumers.runtime.inmemory import MemoryStartJournal
from consumers.runtime.journal import Prior, Start, record_digest
from consumers.runtime.records import Inbound, Position


def test_no_two_keys_and_values_share_a_digest_by_their_concatenation() -> None:
    pairs: list[tuple[bytes | None, bytes | None]] = [
        (None, None),
        (b"", None),
        (None, b""),
        (b"", b""),
        (b"ab", b"c"),
        (b"a", b"bc"),
        (b"abc", None),
        (None, b"abc"),
        (b"abc", b""),
        (b"", b"abc"),
    ]
    digests = [record_digest(key, value) for key, value in pairs]
    assert len(set(digests)) == len(pairs)
    assert all(len(d) == 32 for d in digests)
    assert record_digest(b"ab", b"c") == record_digest(b"ab", b"c")
    assert record_digest(None, b"abc") != hashlib.sha256(b"abc").digest()  # framed, not raw


def test_a_start_is_its_records_position_and_digest() -> None:
    record = Inbound("t", 2, 40, b"k", b'{"q": 1}')
    start = Start.of(record)
    assert start == Start("t", 2, 40, record_digest(b"k", b'{"q": 1}'))
    assert isinstance(start, Position)
    assert start.position == record.position
    assert str(start) == "t/2/40"  # the log lines name it as before
    assert Start.of(Inbound("t", 2, 40, b"k", b'{"q": 2}')) != start


async def test_a_row_of_other_bytes_neither_makes_a_suspect_nor_counts_its_crashes() -> None:
    journal = MemoryStartJournal()
    planted, record = Start("t", 0, 5, bytes(32)), Start("t", 0, 5, record_digest(None, b"{}"))
    for _ in range(5):  # as many starts and solo starts as one likes, of made-up bytes
        await journal.started(planted)
        await journal.solo_started(planted)
    assert await journal.started(planted) == Prior(5, 5)
    assert await journal.started(record) == Prior(0, 0)  # the record's first start
    await journal.solo_started(planted)  # no longer the row's bytes: nothing changes
    assert await journal.started(record) == Prior(1, 0)
    await journal.solo_started(record)
    await journal.solo_finished(planted)
    assert await journal.started(record) == Prior(2, 1)
    assert await journal.started(planted) == Prior(0, 0)  # one row a position: it was reset
    assert await journal.started(record) == Prior(0, 0)
    await journal.forget({("t", 0): 6})
    assert await journal.started(record) == Prior(0, 0)
