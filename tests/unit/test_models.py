"""The contract models: strict budgets, page order, subject keys, the token estimate."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from contextcore.tokens import estimate_tokens
from schemas.context import (
    CLASS_ORDER,
    MAX_CONTEXT_ITEM_LIMIT,
    MAX_ENTITIES,
    MAX_SOURCE_OPTIONS,
    ContextPolicy,
    ContextRequest,
    ContextSourceSpec,
    ContextSubject,
    ResourceRef,
    make_subject_key,
)


@pytest.mark.parametrize("value", ["5", True, 5.0, -1])
def test_budgets_are_strict_non_negative_ints(value: object) -> None:
    with pytest.raises(ValidationError):
        ContextSourceSpec(name="application", token_budget=value)
    with pytest.raises(ValidationError):
        ContextPolicy(sources=[], total_token_budget=value)


@pytest.mark.parametrize("value", ["5", True, -1, MAX_CONTEXT_ITEM_LIMIT + 1])
def test_limit_is_a_strict_int_up_to_the_ceiling(value: object) -> None:
    with pytest.raises(ValidationError):
        ContextSourceSpec(name="application", token_budget=1, limit=value)


def test_zero_budgets_zero_limit_and_none_stay_parseable() -> None:
    spec = ContextSourceSpec(name="application", token_budget=0, limit=0)
    assert (spec.token_budget, spec.limit) == (0, 0)
    assert ContextSourceSpec(name="a", token_budget=1).limit is None
    assert ContextSourceSpec(name="a", token_budget=1, limit=MAX_CONTEXT_ITEM_LIMIT).limit == 999
    assert ContextPolicy(sources=[]).total_token_budget == 0


def test_page_order_refuses_a_kind_twice_and_an_unknown_kind() -> None:
    with pytest.raises(ValidationError, match="names 'memory' twice"):
        ContextPolicy(sources=[], page_order=["memory", "knowledge", "memory"])
    with pytest.raises(ValidationError):
        ContextPolicy(sources=[], page_order=["gossip"])


def test_class_order_holds_the_ten_kinds_with_conversation_first_and_run_history_last() -> None:
    assert len(CLASS_ORDER) == len(set(CLASS_ORDER)) == 10
    assert CLASS_ORDER[0] == "conversation"
    assert CLASS_ORDER[-1] == "run_history"
    assert CLASS_ORDER.index("personal_memory") < CLASS_ORDER.index("application")
    assert CLASS_ORDER.index("application") < CLASS_ORDER.index("dossier")


def test_request_round_trips_through_json() -> None:
    request = ContextRequest(
        subject=ContextSubject(
            organization_id=uuid.uuid4(), user_id=uuid.uuid4(), trigger_id=None, definition_id=None
        ),
        query="what changed?",
        entities=(ResourceRef(kind="crm.company", id="8f21", label="Acme"),),
        run_id=uuid.uuid4(),
    )
    assert ContextRequest.model_validate_json(request.model_dump_json()) == request


@pytest.mark.parametrize(
    ("query", "problem"), [("a\x00b", "holds a NUL byte"), ("a\ud800", "holds a lone surrogate")]
)
def test_the_query_is_text_postgresql_can_hold(query: str, problem: str) -> None:
    """As a memory's text (StorableText): the knowledge source sends the query to PostgreSQL."""
    subject = ContextSubject(
        organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
    )
    with pytest.raises(ValidationError, match=problem) as raised:
        ContextRequest(subject=subject, query=query, entities=())
    assert [e["loc"] for e in raised.value.errors()] == [("query",)]


def test_subject_key_format_and_missing_parts() -> None:
    ref = ResourceRef(kind="crm.company", id="8f21", label="ignored:label")
    assert make_subject_key(ref, "lifecycle_stage") == "crm.company:8f21:lifecycle_stage"
    assert make_subject_key(None, "lifecycle_stage") is None
    assert make_subject_key(ref, None) is None


@pytest.mark.parametrize(
    ("kind", "id_", "attribute"),
    [
        ("", "1", "a"),
        ("k", "", "a"),
        ("k", "1", ""),
        ("k:x", "1", "a"),
        ("k", "1:2", "a"),
        ("k", "1", "preference:x"),
    ],
)
def test_subject_key_refuses_empty_or_colon_parts(kind: str, id_: str, attribute: str) -> None:
    with pytest.raises(ValueError, match="subject key"):
        make_subject_key(ResourceRef(kind=kind, id=id_), attribute)


def test_application_field_and_memory_attribute_never_share_a_key() -> None:
    ref = ResourceRef(kind="crm.company", id="8f21")
    assert make_subject_key(ref, "lifecycle_stage") != make_subject_key(
        ref, "observation.lifecycle_stage"
    )


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("日本", 2), ("😀", 1), ("😀a", 2)],
)
def test_token_estimate_counts_utf8_bytes_rounded_up(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_the_subject_states_every_field_even_when_null() -> None:
    with pytest.raises(ValidationError) as raised:
        ContextSubject.model_validate({"organization_id": str(uuid.uuid4())})
    missing = {e["loc"][0] for e in raised.value.errors() if e["type"] == "missing"}
    assert missing == {"user_id", "trigger_id", "definition_id"}


def test_every_list_a_request_holds_is_bounded() -> None:
    """Validation keeps an error per malformed entry: an unbounded list is unbounded memory."""
    subject = ContextSubject(
        organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
    )
    ref = ResourceRef(kind="crm.company", id="8f21")
    ContextRequest(subject=subject, query="q", entities=(ref,) * MAX_ENTITIES)
    with pytest.raises(ValidationError) as refused:
        ContextRequest(subject=subject, query="q", entities=(ref,) * (MAX_ENTITIES + 1))
    assert refused.value.error_count() == 1
    with pytest.raises(ValidationError) as refused:
        ContextPolicy.model_validate({"sources": [{}] * 100_000})
    assert refused.value.error_count() == 1  # not two per entry
    options = {f"o{i}": i for i in range(MAX_SOURCE_OPTIONS + 1)}
    with pytest.raises(ValidationError):
        ContextSourceSpec(name="x", token_budget=1, options=options)
    with pytest.raises(ValidationError):
        ContextPolicy.model_validate({"sources": [], "page_order": ["memory"] * 11})
