"""Read-your-writes (issue 34): database positions on the wire, the client's session, and which
builder reads a request that names a position (consumers/build/read_after.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from consumers.build.metrics import BuildMetrics
from consumers.build.read_after import Readers
from contextcore.builder import ContextBuilder
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


def readers(replay: Replay | None) -> tuple[Readers, BuildMetrics]:
    metrics = BuildMetrics.create(CollectorRegistry())
    chosen = Readers(
        read=as_builder(Builder("read")),
        metrics=metrics,
        primary=None if replay is None else as_builder(Builder("primary")),
        replay=replay,
    )
    return chosen, metrics


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


async def test_without_a_replica_a_position_reads_the_primary_it_reads_anyway() -> None:
    chosen, metrics = readers(None)
    assert name(await chosen.builder("FFFFFFFF/FFFFFFFF")) == "read"
    assert count(metrics, "primary") == 1
