"""The build-request message boundary and the consumer's decision, without a broker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from consumers.build.handler import BuildHandler
from consumers.build.metrics import BuildMetrics
from consumers.runtime.records import DeadLetter, Inbound, Outcome, Reply, Stopwatch
from contextcore.builder import ContextBuilder, DefaultContextBuilder
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSourceRegistry
from schemas.build import BuildReplyV1, ErrorInfo, parse_build_request
from schemas.context import BriefManifest, ContextBrief, ContextPolicy, ContextRequest, ResourceRef
from schemas.envelope import reply_address
from tests.unit.fakes import StaticSource, item

ORG = "6f1c2a3b-0000-4000-8000-000000000001"
REPLY_TOPICS = ReplyTopics.of(TopicSettings.model_construct(reply_prefix="replies"))
"""``replies.a`` and every other name under ``replies``."""


def message(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "correlation_id": "c-1",
        "reply_to": "replies.a",
        "request": {
            "subject": {
                "organization_id": ORG,
                "user_id": None,
                "trigger_id": None,
                "definition_id": None,
            },
            "query": "q",
            "entities": [],
        },
        "policy": {"total_token_budget": 10, "sources": [{"name": "a", "token_budget": 5}]},
    }
    base.update(overrides)
    return base


def service(*sources: StaticSource) -> tuple[ContextSourceRegistry, DefaultContextBuilder]:
    registry = ContextSourceRegistry(sources or [StaticSource("a")])
    return registry, DefaultContextBuilder(registry, ContextPacker())


async def decide(value: bytes, registry: ContextSourceRegistry, builder: ContextBuilder) -> Outcome:
    """The build handler's outcome for one record value (no broker, no runtime)."""
    handler = BuildHandler(
        registry, builder, BuildMetrics.create(CollectorRegistry()), reply_topics=REPLY_TOPICS
    )
    record = Inbound(topic="t", partition=0, offset=0, key=None, value=value)
    return await handler.handle(record, Stopwatch())


def error_of(outcome: Outcome) -> ErrorInfo:
    error = reply_of(outcome).error
    assert error is not None
    return error


def reply_of(outcome: Outcome) -> BuildReplyV1:
    """The build reply an outcome carries (the test fails when it carries none)."""
    assert isinstance(outcome, Reply)
    assert isinstance(outcome.message, BuildReplyV1)
    return outcome.message


def test_malformed_entities_are_dropped_and_valid_refs_kept_in_order() -> None:
    raw = message()
    raw["request"]["entities"] = [
        {"kind": "crm.company", "id": "1"},
        {"kind": "crm.person"},
        42,
        {"kind": "crm.deal", "id": "2", "label": "Big"},
        {"kind": "x", "id": "3", "extra": 1},
    ]
    envelope, dropped = parse_build_request(raw)
    assert dropped == 3
    assert envelope.request.entities == (
        ResourceRef(kind="crm.company", id="1"),
        ResourceRef(kind="crm.deal", id="2", label="Big"),
    )
    assert envelope.request.query == "q"  # the rest of the request is kept


async def test_a_nul_in_the_query_is_an_invalid_request_and_no_source_reads_it() -> None:
    """Issue 17, item 5: PostgreSQL refuses a NUL in text, and the knowledge source searches the
    query: refused at the boundary, never a failed source. Other control characters pass."""
    raw = message()
    raw["request"]["query"] = "refunds\x00 after 30 days"
    with pytest.raises(ValidationError, match="holds a NUL byte"):
        parse_build_request(raw)
    source = StaticSource("a")
    outcome = await decide(json.dumps(raw).encode(), *service(source))
    assert isinstance(outcome, Reply)
    assert (outcome.topic, outcome.correlation_id) == ("replies.a", "c-1")
    assert error_of(outcome).code == "invalid_request"
    assert error_of(outcome).details == ["request.query: Value error, holds a NUL byte"]
    assert source.calls == 0
    raw["request"]["query"] = "tabs\tand\nnew lines"
    assert parse_build_request(raw)[0].request.query == "tabs\tand\nnew lines"


@pytest.mark.parametrize("reply_to", ["", ".", "..", "has space", "a/b", "x" * 250])
def test_reply_to_must_be_a_kafka_topic_name(reply_to: str) -> None:
    with pytest.raises(ValidationError):
        parse_build_request(message(reply_to=reply_to))
    assert reply_address(message(reply_to=reply_to)) is None


def test_unknown_schema_version_and_extra_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        parse_build_request(message(schema_version=2))
    with pytest.raises(ValidationError):
        parse_build_request(message(surprise=True))


async def test_not_json_is_dead_lettered() -> None:
    outcome = await decide(b"\xff\xfe not json", *service())
    assert isinstance(outcome, DeadLetter)
    assert (outcome.cause, outcome.reason) == ("not_json", "not UTF-8 at byte 0")


async def test_invalid_request_without_an_address_is_dead_lettered() -> None:
    outcome = await decide(json.dumps({"policy": {}}).encode(), *service())
    assert isinstance(outcome, DeadLetter)
    assert "without a usable reply_to/correlation_id" in outcome.reason


async def test_invalid_request_with_an_address_gets_an_error_reply() -> None:
    outcome = await decide(json.dumps(message(policy={"sources": "x"})).encode(), *service())
    assert isinstance(outcome, Reply)
    assert (outcome.topic, outcome.correlation_id) == ("replies.a", "c-1")
    assert reply_of(outcome).status == "error"
    assert error_of(outcome).code == "invalid_request"
    assert error_of(outcome).details == ["policy.sources: Input should be a valid list"]


async def test_a_builder_that_raises_becomes_an_internal_error_reply() -> None:
    class Broken:
        async def build(self, request: ContextRequest, policy: ContextPolicy) -> ContextBrief:
            raise RuntimeError("boom")

        async def build_explained(
            self, request: ContextRequest, policy: ContextPolicy
        ) -> tuple[ContextBrief, BriefManifest]:
            raise RuntimeError("boom")

    registry, _ = service()
    outcome = await decide(json.dumps(message()).encode(), registry, Broken())
    assert isinstance(outcome, Reply)
    assert error_of(outcome).code == "internal_error"
    assert error_of(outcome).message == (  # the error's class, never its text
        "the build failed (RuntimeError); the service's log has the detail under this "
        "correlation id"
    )


async def test_valid_request_gets_the_built_brief_and_the_dropped_count() -> None:
    raw = message()
    raw["request"]["entities"] = [{"kind": "crm.company", "id": "1"}, {"id": "no kind"}]
    outcome = await decide(json.dumps(raw).encode(), *service(StaticSource("a", [item("a")])))
    assert isinstance(outcome, Reply)
    expected = ContextPacker().pack([item("a")], ContextPolicy.model_validate(raw["policy"]))
    assert reply_of(outcome) == BuildReplyV1.ok("c-1", expected, dropped_entities=1)
    assert expected.text == "## Application state\n- t: b"


async def test_a_policy_failing_admission_gets_policy_rejected() -> None:
    raw = message(policy={"total_token_budget": 0, "sources": [{"name": "a", "token_budget": 5}]})
    outcome = await decide(json.dumps(raw).encode(), *service())
    assert isinstance(outcome, Reply)
    assert error_of(outcome).code == "policy_rejected"
    assert error_of(outcome).details == ["total_token_budget: is 0 but source 'a' is enabled"]


async def test_a_required_source_failure_gets_required_source_failed() -> None:
    raw = message(
        policy={
            "total_token_budget": 10,
            "sources": [{"name": "a", "token_budget": 5, "required": True}],
        }
    )
    outcome = await decide(
        json.dumps(raw).encode(), *service(StaticSource("a", error=RuntimeError("db down")))
    )
    assert isinstance(outcome, Reply)
    assert error_of(outcome).code == "required_source_failed"
    assert error_of(outcome).details == ["a: failed (RuntimeError)"]  # never the error's text


@pytest.mark.parametrize(("refresh", "status"), [(True, "ok"), (False, "reuse_previous")])
async def test_a_resume_rebuilds_only_when_the_policy_asks(refresh: bool, status: str) -> None:
    source = StaticSource("a", [item("a")])
    raw = message(resumed_after_wait=True)
    raw["policy"]["refresh_on_resume"] = refresh
    outcome = await decide(json.dumps(raw).encode(), *service(source))
    assert isinstance(outcome, Reply)
    assert reply_of(outcome).status == status
    assert source.calls == (1 if refresh else 0)
    assert (reply_of(outcome).brief is not None) == refresh
