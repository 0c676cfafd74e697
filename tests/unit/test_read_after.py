"""Read-your-writes (issue 34): database positions on the wire, the client's session, and which
builder reads a request that names a position (consumers/build/read_after.py)."""

from __future__ import annotations

import asyncio
from unittest.mock import patch

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from consumers.build.metrics import BuildMetrics
from consumers.build.read_after import Primary, Readers
from contextcore.builder import ContextBuilder
from contextcore.storage.positions import TRUST_S, PrimaryWatch, ReplayWatch, write_position
from producers.client import Session
from schemas.build import BuildRequestV1
from schemas.position import latest, position_value


def test_positions_order_as_postgresql_orders_them() -> None:
    assert position_value("0/0") == 0
    assert position_value("1/0") == 2**32
    assert position_value("0/FFFFFFFF") < position_value("1/0")
    assert position_value("16/B374D848") == position_value("16/b374d848")
    assert latest("0/9", "0/10", None) == "0/10"  # hexadecimal, not text order
    assert latest("2/0", "10/0") == "10/0"
    assert latest(None, None) is None


@pytest.mark.parametrize(
    "text", ["", "0", "0/", "/0", "0x1/0", "1/0/0", "123456789/0", "g/0", " 1/0", "1/0\n", "-1/0"]
)
def test_what_is_not_a_position_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a database position"):
        position_value(text)


def request(read_after: object) -> dict[str, object]:
    subject: dict[str, str | None] = {"organization_id": "00000000-0000-4000-8000-000000000001"}
    subject |= {"user_id": None, "trigger_id": None, "definition_id": None}
    return {
        "correlation_id": "c",
        "reply_to": "contextcore.reply.test",
        "request": {"subject": subject, "query": "hi", "entities": []},
        "policy": {"total_token_budget": 10, "sources": []},
        "read_after": read_after,
    }


def test_a_build_request_names_a_position_or_is_invalid() -> None:
    assert BuildRequestV1.model_validate(request("6/2C47DA88")).read_after == "6/2C47DA88"
    assert BuildRequestV1.model_validate(request(None)).read_after is None
    for bad in ("latest", "6/2C47DA88; DROP", 6, "1" * 20 + "/0"):
        with pytest.raises(ValidationError):
            BuildRequestV1.model_validate(request(bad))


def test_a_session_keeps_the_latest_position_it_was_told() -> None:
    session = Session()
    assert session.position is None
    session.note("0/20")
    session.note(None)  # an answer without one changes nothing
    session.note("0/10")  # an earlier write answered late
    assert session.position == "0/20"
    session.note("1/0")
    assert session.position == "1/0"


class Builder:
    """A builder that is only told apart from the others (the choice is under test)."""

    def __init__(self, name: str) -> None:
        self.name = name


class Replay:
    def __init__(self, replayed: int) -> None:
        self.replayed = replayed
        self.asked: list[str] = []

    async def reached(self, position: str) -> bool:
        self.asked.append(position)
        return position_value(position) <= self.replayed


class Written:
    def __init__(self, written: int) -> None:
        self.written = written

    async def wrote(self, position: str) -> bool:
        return position_value(position) <= self.written


def readers(replay: Replay | None, written: int = 2**63) -> tuple[Readers, BuildMetrics]:
    metrics = BuildMetrics.create(CollectorRegistry())
    primary = None
    if replay is not None:
        primary = Primary(as_builder(Builder("primary")), replay, Written(written))
    return Readers(read=as_builder(Builder("read")), metrics=metrics, primary=primary), metrics


def as_builder(builder: Builder) -> ContextBuilder:
    return builder  # type: ignore[return-value]  # told apart by name only


def name(builder: ContextBuilder) -> str:
    assert isinstance(builder, Builder)
    return builder.name


def count(metrics: BuildMetrics, database: str) -> float:
    return float(metrics.read_after.labels(database)._value.get())


async def test_without_a_position_the_read_database_serves_with_no_question() -> None:
    replay = Replay(replayed=0)
    chosen, metrics = readers(replay)
    assert name(await chosen.builder(None)) == "read"
    assert replay.asked == []  # no round trip for the common case
    assert count(metrics, "replica") == count(metrics, "primary") == 0


async def test_a_position_the_replica_has_replayed_reads_the_replica() -> None:
    chosen, metrics = readers(Replay(replayed=position_value("5/0")))
    assert name(await chosen.builder("4/FFFFFFFF")) == "read"
    assert name(await chosen.builder("5/0")) == "read"
    assert count(metrics, "replica") == 2


async def test_a_position_past_the_replica_reads_the_primary() -> None:
    chosen, metrics = readers(Replay(replayed=position_value("5/0")))
    assert name(await chosen.builder("5/1")) == "primary"
    assert count(metrics, "primary") == 1
    assert count(metrics, "replica") == 0


async def test_a_position_the_primary_never_wrote_is_read_as_none() -> None:
    """A made-up position (or another cluster's) would send the builds to the primary for
    ever: it reads the replica, counted ``ignored``."""
    replay = Replay(replayed=position_value("5/0"))
    chosen, metrics = readers(replay, written=position_value("6/0"))
    assert name(await chosen.builder("FFFFFFFF/FFFFFFFF")) == "read"
    assert replay.asked == []
    assert count(metrics, "ignored") == 1
    assert name(await chosen.builder("5/8")) == "primary"  # written, not yet replayed


async def test_without_a_replica_a_position_reads_the_primary_it_reads_anyway() -> None:
    chosen, metrics = readers(None)
    assert name(await chosen.builder("FFFFFFFF/FFFFFFFF")) == "read"
    assert count(metrics, "primary") == 1


# ----------------------------------------------------------- the database's answers (a fake pool)


class Pool:
    """What ReplayWatch, PrimaryWatch and write_position ask of an asyncpg pool: one answer
    after another, an exception raised, or a wait past the check's bound."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def _next(self) -> object:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)
        return answer

    async def fetchrow(self, query: str) -> object:
        return await self._next()

    async def fetchval(self, query: str) -> object:
        return await self._next()


def pool(*answers: object) -> asyncpg.Pool:
    return Pool(*answers)  # type: ignore[return-value]  # the two methods used


def asked(fake: asyncpg.Pool) -> int:
    assert isinstance(fake, Pool)
    return fake.asked


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def standby(replayed: str | None) -> dict[str, object]:
    return {"standby": True, "replayed": replayed}


async def test_the_replay_seen_is_trusted_for_a_second_then_asked_again() -> None:
    clock = Clock()
    fake = pool(standby("5/0"), standby("6/0"))
    watch = ReplayWatch(fake, clock=clock)
    assert await watch.reached("4/0")
    assert await watch.reached("5/0")  # at or before the replay seen: no round trip
    assert asked(fake) == 1
    clock.now = TRUST_S + 0.1  # the server behind the URL may have changed
    assert await watch.reached("5/0")
    assert asked(fake) == 2
    assert watch.replayed == position_value("6/0")


async def test_a_position_past_the_replay_is_asked_each_time() -> None:
    fake = pool(standby("5/0"), standby("5/0"), standby("5/10"))
    watch = ReplayWatch(fake, clock=Clock())
    assert not await watch.reached("5/8")
    assert not await watch.reached("5/8")
    assert await watch.reached("5/8")
    assert asked(fake) == 3


async def test_a_server_not_in_recovery_has_everything_and_is_not_cached() -> None:
    fake = pool({"standby": False, "replayed": None}, standby("1/0"))
    watch = ReplayWatch(fake, clock=Clock())
    assert await watch.reached("FFFF/0")  # a primary (or a promoted standby)
    assert not await watch.reached("2/0")  # a standby again: asked, not remembered as a primary


async def test_a_replica_that_cannot_say_sends_the_build_to_the_primary() -> None:
    watch = ReplayWatch(pool(OSError("refused"), "hang", standby(None), None), clock=Clock())
    assert not await watch.reached("1/0")  # an error
    with patch("contextcore.storage.positions.CHECK_TIMEOUT_S", 0.05):
        assert not await watch.reached("1/0")  # no answer in time
    assert not await watch.reached("1/0")  # a standby that replayed nothing yet
    assert await watch.reached("1/0")  # no row at all: nothing to wait for


async def test_the_primary_s_position_bounds_what_a_caller_may_name() -> None:
    fake = pool("5/0", "6/0", OSError("gone"))
    watch = PrimaryWatch(fake)
    assert await watch.wrote("4/0")
    assert await watch.wrote("5/0")
    assert asked(fake) == 1  # at or before the position seen: no round trip
    assert await watch.wrote("5/80")  # past it: asked again, and the primary has moved on
    assert await watch.wrote("7/0")  # the primary cannot say: the caller is believed


async def test_a_write_s_position_is_best_effort() -> None:
    assert await write_position(pool("6/2E8CEED0")) == "6/2E8CEED0"
    assert await write_position(pool(asyncpg.InterfaceError("closed"))) is None
    assert await write_position(pool(None)) is None
    with patch("contextcore.storage.positions.CHECK_TIMEOUT_S", 0.05):
        assert await write_position(pool("hang")) is None
