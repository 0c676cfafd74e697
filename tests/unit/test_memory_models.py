"""The memory write contract is strict, and the stored-ref parser reads each element alone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contextcore.memory.refs import parse_stored_refs
from contextcore.memory.service import fingerprint, remember_write, subject_key
from schemas.memory import (
    ForgetV1,
    Invoker,
    MemoryCandidate,
    MemorySubjectRef,
    RememberV1,
    not_blank,
    parse_memory_write,
)

ORG = uuid.UUID("7d000000-0000-4000-8000-0000000000a1")
USER = uuid.UUID("7d000000-0000-4000-8000-00000000e001")
INVOKER = Invoker(organization_id=ORG, definition_id=uuid.uuid4(), user_id=USER)


def candidate(**changes: Any) -> dict[str, Any]:
    return {"scope": "user", "attribute": "preference.tone", "text": "Be brief", **changes}


def test_a_model_supplied_subject_key_is_refused_not_ignored() -> None:
    with pytest.raises(ValidationError, match="subject_key"):
        MemoryCandidate.model_validate(candidate(subject_key="crm.company:x:lifecycle_stage"))


@pytest.mark.parametrize(
    "changes",
    [
        {"attribute": "preference:tone"},
        {"attribute": " \t"},
        {"attribute": ""},
        {"text": "\u00a0\u3000\u2028"},
        {"text": "nul\x00byte"},
        {"text": "lone \ud800 surrogate"},
        {"text": "x" * 4_001},
        {"scope": "team"},
        {"subject_refs": [{"kind": "crm.company", "id": "a"}, {"kind": "crm.company", "id": "b"}]},
        {"subject_refs": [{"kind": "crm.company", "id": "a:b"}]},
        {"subject_refs": [{"kind": "\u2003", "id": "a"}]},
        {"subject_refs": [{"kind": "crm.company", "id": "a", "extra": 1}]},
    ],
)
def test_invalid_candidates_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        MemoryCandidate.model_validate(candidate(**changes))


def test_a_label_joins_no_key_and_may_hold_a_colon() -> None:
    ref = MemorySubjectRef(kind="crm.company", id="42", label="Acme: EU")
    memory = MemoryCandidate.model_validate(candidate(subject_refs=[ref.model_dump()]))
    assert subject_key(INVOKER, memory) == "crm.company:42:preference.tone"


def test_keys_come_from_the_ref_or_the_scope_owner() -> None:
    assert subject_key(INVOKER, MemoryCandidate.model_validate(candidate())) == (
        f"user:{USER}:preference.tone"
    )
    shared = MemoryCandidate.model_validate(candidate(scope="organization"))
    assert subject_key(INVOKER, shared) == f"organization:{ORG}:preference.tone"


@pytest.mark.parametrize(
    ("scope", "kind", "spelling"),
    [
        ("organization", "organization", str(ORG)),
        ("organization", "organization", str(ORG).upper()),
        ("user", "user", str(USER)),
        ("user", "user", USER.hex),
    ],
)
def test_a_ref_naming_the_scope_owner_is_written_as_no_ref(
    scope: str, kind: str, spelling: str
) -> None:
    """CLARIFICATIONS 16: the same key and the same stored row as no ref at all, so the read
    never drops it as a kind no resolver owns."""
    owned = MemoryCandidate.model_validate(
        candidate(scope=scope, subject_refs=[{"kind": kind, "id": spelling}])
    )
    plain = MemoryCandidate.model_validate(candidate(scope=scope))
    with_ref, without = (remember_write(INVOKER, c, "k") for c in (owned, plain))
    assert with_ref["subject_key"] == without["subject_key"] == subject_key(INVOKER, plain)
    assert with_ref["subject_refs"] == without["subject_refs"] == []


@pytest.mark.parametrize(
    ("scope", "kind", "named"),
    [
        ("organization", "user", USER),  # the asker's fact would become the organization's
        ("user", "organization", ORG),
        ("organization", "organization", uuid.uuid4()),
        ("user", "user", uuid.uuid4()),
    ],
)
def test_any_other_ref_of_an_owner_kind_is_refused(scope: str, kind: str, named: uuid.UUID) -> None:
    """Never written and then dropped at every read (no resolver owns the kind), and never
    re-keyed under another owner."""
    memory = MemoryCandidate.model_validate(
        candidate(scope=scope, subject_refs=[{"kind": kind, "id": str(named)}])
    )
    refusal = remember_write(INVOKER, memory, "k")["refusal"]
    assert refusal["reason"] == "invalid_input"
    assert f"{kind}:{named}" in refusal["message"]


def test_a_principal_is_exactly_one_of_a_user_or_a_trigger_and_flags_are_strict() -> None:
    base = {"organization_id": str(ORG), "definition_id": str(uuid.uuid4())}
    with pytest.raises(ValidationError, match="exactly one"):
        Invoker.model_validate(base)
    with pytest.raises(ValidationError, match="exactly one"):
        Invoker.model_validate({**base, "user_id": str(USER), "trigger_id": str(uuid.uuid4())})
    with pytest.raises(ValidationError):
        Invoker.model_validate({**base, "user_id": str(USER), "workflow_node": "true"})


def test_the_topic_refuses_an_unknown_action_and_an_extra_envelope_field() -> None:
    message = {
        "action": "remember",
        "correlation_id": "c",
        "reply_to": "r",
        "idempotency_key": "k",
        "principal": {"organization_id": str(ORG), "definition_id": str(ORG), "user_id": str(USER)},
        "memory": candidate(),
    }
    assert isinstance(parse_memory_write(message), RememberV1)
    forget = {**message, "action": "forget", "memory_id": str(uuid.uuid4())}
    del forget["memory"]
    assert isinstance(parse_memory_write(forget), ForgetV1)
    for broken in ({**message, "action": "update"}, {**message, "subject_key": "x"}):
        with pytest.raises(ValidationError):
            parse_memory_write(broken)


def test_the_stored_ref_parser_refuses_each_malformed_element_alone() -> None:
    assert parse_stored_refs("[]") == ([], 0)
    refs, refused = parse_stored_refs('[{"kind": "crm.company", "id": "1", "later": true}]')
    assert (refs, refused) == ([MemorySubjectRef(kind="crm.company", id="1")], 0)
    for broken in (
        '[{"kind": "crm.company"}]',
        '[{"kind": "crm.company", "id": 1}]',
        '[{"kind": "\\t", "id": "1"}]',
        '[{"kind": "crm.company", "id": "1:2"}]',
        '["crm.company"]',
    ):
        assert parse_stored_refs(broken) == ([], 1), broken
    assert parse_stored_refs('{"kind": "x"}') == ([], 1)
    assert parse_stored_refs("not json") == ([], 1)
    two = '[{"kind": "a", "id": "1"}, {"id": "2"}]'
    assert parse_stored_refs(two) == ([MemorySubjectRef(kind="a", id="1")], 1)


@given(st.text(max_size=20))
def test_blank_is_what_python_calls_whitespace(text: str) -> None:
    assert not_blank(text) == (text.strip() != "")


def test_the_fingerprint_tells_a_reused_key_from_a_redelivery() -> None:
    one = fingerprint("remember", INVOKER, candidate())
    assert one == fingerprint("remember", INVOKER, candidate())
    assert one != fingerprint("remember", INVOKER, candidate(text="Be thorough"))
    assert one != fingerprint("forget", INVOKER, candidate())
