"""The runtime login cannot censor a future record through the start journal (issue 32, item 7).

The attack: a journal row is keyed by a position, and a position exists before its record does.
With the runtime credential an attacker planted rows for a build-request topic's next offsets,
as suspects that had already taken their process down alone, and each valid request that later
arrived there was dead-lettered as ``crashed_the_consumer`` without running. Now (migration
00036) the service role holds no privilege on ``delivery_starts`` and writes it only through
narrow functions, and a row counts for a record only when it holds the digest of that record's
key and value: a row planted before the record existed cannot.

This module imports nothing of the journal's code: it plants with SQL and counts on a real
``contextcore serve build`` process, so it runs as well against the code before the fix.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from broker.topics import dead_letter_topic
from contextcore.storage.tenancy import SERVICE_ROLE
from tests.integration.helpers import assigned_reader, producer, read_json, request_message
from tests.services import Config, Database, StartConsumer

pytestmark = pytest.mark.integration

PARTITIONS = 4  # the test config's build_request_partitions
REQUESTS_PER_PARTITION = 3
PLANTED = range(8)  # each partition's next offsets: the topic is new, none has a record yet
HIGH = 20  # starts and solo starts per planted row: far past max_crashes (2)

STARTED = (
    'SELECT "partition", "offset", starts, solo_starts'
    " FROM contextcore_journal_started($1, $2, $3::integer[], $4::bigint[], $5::bytea[])"
)
SOLO = "SELECT contextcore_journal_solo($1, $2, $3, $4, $5, $6)"
FORGET = "SELECT contextcore_journal_forget($1, $2, $3::integer[], $4::bigint[])"
PRUNE = "SELECT contextcore_journal_prune($1::interval, $2)"


@pytest.fixture
async def runtime(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """The runtime login as the service role for its whole session, as a consumer's pool is."""
    conn = await asyncpg.connect(database.url)
    await conn.execute(f"SET ROLE {SERVICE_ROLE}")
    yield conn
    await conn.close()


def framed_sha256(key: bytes | None, value: bytes | None) -> bytes:
    """The record digest as the journal frames it (the attacker reads the same code)."""
    h = hashlib.sha256()
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01" + len(part).to_bytes(8, "big") + part)
    return h.digest()


def guesses(reply_to: str) -> list[Callable[[int, int], bytes]]:
    """Made-up digests, one rule per planted row in turn: random bytes, the digest of nothing,
    and a correctly framed digest of a plausible request (another correlation id)."""
    return [
        lambda p, o: secrets.token_bytes(32),
        lambda p, o: framed_sha256(None, b""),
        lambda p, o: framed_sha256(
            None, json.dumps(request_message(f"guess-{p}-{o}", reply_to)).encode()
        ),
    ]


async def attempt(conn: asyncpg.Connection, sql: str, *args: Any) -> str | None:
    """``None`` when the statement went through; the error's class name when refused."""
    try:
        await conn.fetch(sql, *args)
    except asyncpg.PostgresError as error:
        return type(error).__name__
    return None


async def plant(
    conn: asyncpg.Connection, group: str, topic: str, reply_to: str
) -> dict[str, str | None]:
    """Every way the runtime login has to write journal rows for ``topic``'s next offsets, each
    as far as it goes; what each way got (``None``: accepted)."""
    positions = [(p, o) for p in range(PARTITIONS) for o in PLANTED]
    partitions, offsets = [p for p, _ in positions], [o for _, o in positions]
    rules = guesses(reply_to)
    digests = [rules[i % len(rules)](p, o) for i, (p, o) in enumerate(positions)]
    got: dict[str, str | None] = {
        "insert": await attempt(
            conn,
            "INSERT INTO delivery_starts"
            ' (consumer_group, topic, "partition", "offset", starts, solo_starts)'
            " SELECT $1, $2, p, o, $5, $5 FROM unnest($3::integer[], $4::bigint[]) AS r(p, o)",
            group,
            topic,
            partitions,
            offsets,
            HIGH,
        ),
        "update": await attempt(
            conn,
            "UPDATE delivery_starts SET starts = $3, solo_starts = $3"
            " WHERE consumer_group = $1 AND topic = $2",
            group,
            topic,
            HIGH,
        ),
    }
    for _ in range(HIGH):
        got["started"] = await attempt(conn, STARTED, group, topic, partitions, offsets, digests)
    for _ in range(HIGH):
        for (partition, offset), digest in zip(positions, digests, strict=True):
            got["solo"] = await attempt(conn, SOLO, group, topic, partition, offset, digest, 1)
    return got


async def dead_letters(config: Config) -> int:
    """How many records the build-request topic's dead-letter topic holds."""
    reader = await assigned_reader(config.bootstrap, dead_letter_topic(config.request_topic))
    try:
        ends = await reader.end_offsets(list(reader.assignment()))
    finally:
        await reader.stop()
    return sum(ends.values())


@pytest.mark.timeout(300)
async def test_rows_planted_for_future_offsets_cannot_censor_the_records_that_arrive_there(
    config: Config,
    runtime: asyncpg.Connection,
    admin: asyncpg.Connection,
    start_consumer: StartConsumer,
) -> None:
    config = config.with_("build", max_crashes=2)
    group, topic = config.build.group_id, config.request_topic
    reply_to = config.reply_topic(f"planted-{uuid.uuid4().hex[:8]}")
    got = await plant(runtime, group, topic, reply_to)
    # the planting took: every planted row is a suspect that died alone far past max_crashes
    planted = await admin.fetchval(
        "SELECT count(*) FROM delivery_starts"
        " WHERE consumer_group = $1 AND topic = $2 AND starts >= $3 AND solo_starts >= $3",
        group,
        topic,
        HIGH,
    )
    assert planted == PARTITIONS * len(PLANTED), got

    await start_consumer(config)
    sent = [
        (partition, f"valid-{partition}-{i}")
        for partition in range(PARTITIONS)
        for i in range(REQUESTS_PER_PARTITION)
    ]
    send = await producer(config.bootstrap)
    try:
        for partition, correlation_id in sent:
            message = request_message(correlation_id, reply_to)
            await send.send_and_wait(topic, json.dumps(message).encode(), partition=partition)
    finally:
        await send.stop()

    replies = await read_json(config.bootstrap, reply_to, until=len(sent), timeout=120)
    answers = {r["correlation_id"]: (r["status"], r.get("error")) for r in replies}
    assert answers == {cid: ("ok", None) for _, cid in sent}
    assert await dead_letters(config) == 0  # a give-up letter goes out before its farewell
    # and every way the login had to write the journal directly was refused
    assert (got["insert"], got["update"]) == ("InsufficientPrivilegeError",) * 2, got
    assert (got["started"], got["solo"]) == (None, None), got  # the narrow doors: open, harmless


async def test_the_runtime_login_cannot_read_or_write_the_journal_table(
    database: Database, runtime: asyncpg.Connection, admin: asyncpg.Connection
) -> None:
    """Not even SELECT: it must not learn the digests of the records in flight and aim rows
    at them. As the service role and as the bare login."""
    await admin.execute(
        'INSERT INTO delivery_starts (consumer_group, topic, "partition", "offset", digest)'
        " VALUES ('g', 't', 0, 0, $1)",
        bytes(32),
    )
    statements = [
        "SELECT digest FROM public.delivery_starts",
        "SELECT count(*) FROM public.delivery_starts",
        "INSERT INTO public.delivery_starts"
        ' (consumer_group, topic, "partition", "offset", digest)'
        " VALUES ('g', 't', 0, 1, '\\x00'::bytea)",
        "UPDATE public.delivery_starts SET solo_starts = 9",
        "DELETE FROM public.delivery_starts",
        "TRUNCATE public.delivery_starts",
        "COPY public.delivery_starts TO STDOUT",
    ]
    bare = await asyncpg.connect(database.url)  # without the service role: not even the schema
    try:
        for conn in (runtime, bare):
            for sql in statements:
                assert await attempt(conn, sql) == "InsufficientPrivilegeError", sql
        for sql, args in (  # the narrow functions are the service role's only
            (STARTED, ("g", "t", [0], [5], [bytes(32)])),
            (SOLO, ("g", "t", 0, 0, bytes(32), 1)),
            (FORGET, ("g", "t", [0], [1])),
            (PRUNE, (timedelta(days=1), 10)),
        ):
            qualified = sql.replace("contextcore_journal", "public.contextcore_journal")
            assert await attempt(bare, qualified, *args) == "InsufficientPrivilegeError", sql
    finally:
        await bare.close()
    row = await admin.fetchrow("SELECT starts, solo_starts FROM delivery_starts")
    assert row is not None
    assert tuple(row) == (1, 0)


async def test_the_narrow_functions_refuse_what_is_not_theirs_to_do(
    runtime: asyncpg.Connection, admin: asyncpg.Connection
) -> None:
    """Malformed arguments are refused; NULLs are refused or change nothing (no
    three-valued-logic hole lets a NULL digest match a row)."""
    d = bytes(range(32))
    assert await attempt(runtime, STARTED, "g", "t", [0, 1], [0, 1], [d, d]) is None
    before = [tuple(r) for r in await admin.fetch("SELECT * FROM delivery_starts ORDER BY 1,2,3,4")]
    refused: list[tuple[Any, ...]] = [
        ("g", "t", [0], [2, 3], [d]),  # unequal arrays
        ("g", "t", [0], [2], [d, d]),
        ("g", "t", None, [2], [d]),
        ("g", "t", [0], [2], None),
        ("g", "t", [0], [2], [None]),  # a start without a digest
        ("g", "t", [0], [2], [d[:31]]),  # a digest that is not a sha256
        ("g", "t", [0], [None], [d]),
        (None, "t", [0], [2], [d]),
        ("g", None, [0], [2], [d]),
        ("g", "t", [0, 0], [2, 2], [d, d]),  # one row twice in one statement
        ("g", "t", [0] * 10_001, list(range(10_001)), [d] * 10_001),  # too many at once
    ]
    for args in refused:
        assert await attempt(runtime, STARTED, *args) is not None, args
    for change in (None, 0, 2, -2):
        assert await attempt(runtime, SOLO, "g", "t", 0, 0, d, change) is not None, change
    unchanged: list[tuple[Any, ...]] = [  # a NULL anywhere matches no row: nothing changes
        (None, "t", 0, 0, d, 1),
        ("g", None, 0, 0, d, 1),
        ("g", "t", None, 0, d, 1),
        ("g", "t", 0, None, d, 1),
        ("g", "t", 0, 0, None, 1),
        ("g", "t", 0, 0, bytes(32), 1),  # another digest
    ]
    for args in unchanged:
        assert await attempt(runtime, SOLO, *args) is None, args
    unchanged = [
        (None, "t", [0], [10]),
        ("g", None, [0], [10]),
        ("g", "t", [None], [10]),
        ("g", "t", [0], [None]),
        ("g", "t", None, None),
    ]
    for args in unchanged:
        assert await attempt(runtime, FORGET, *args) is None, args
    refused = [("g", "t", [0, 1], [10]), ("g", "t", None, [10]), ("g", "t", [0], None)]
    for args in refused:
        assert await attempt(runtime, FORGET, *args) is not None, args
    day = timedelta(days=1)
    for retention, batch in ((None, 10), (day, None), (timedelta(0), 10), (-day, 10),
                             (day, 0), (day, 1_000_001)):  # fmt: skip
        assert await attempt(runtime, PRUNE, retention, batch) is not None, (retention, batch)
    after = [tuple(r) for r in await admin.fetch("SELECT * FROM delivery_starts ORDER BY 1,2,3,4")]
    assert after == before
