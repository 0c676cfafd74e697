"""The JSON Schemas in docs/schemas/ (issue 35): what the code generates, valid draft 2020-12,
and they accept the messages the service reads and writes and refuse what it refuses."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker
from pydantic import BaseModel

from broker.lanes import HEADER_ORGANIZATION, organization_header
from broker.tracing import MAX_TRACE_HEADER
from consumers.runtime.asyncapi import as_asyncapi
from consumers.runtime.letters import dead_letter
from consumers.runtime.records import (
    HEADER_ATTEMPT,
    HEADER_LAST_ERROR,
    MAX_LAST_ERROR_CHARS,
    Inbound,
)
from devstack.asyncapi import documents as asyncapi_documents
from devstack.json_schemas import DOCS, MESSAGES, documents
from schemas.build import BuildReplyV1, ErrorInfo
from schemas.context import ContextBrief, ResourceRef
from schemas.envelope import DeadLetterV1
from schemas.memory import AgentMemory, Invoker, MemoryAnswerV1, Written
from schemas.upload import UploadStatusV1
from tests.integration.helpers import ORG, remember_message, request_message

REPLY_TO = "contextcore.reply.svc"
PRINCIPAL = Invoker(
    organization_id=uuid.UUID(ORG), definition_id=uuid.uuid4(), user_id=uuid.uuid4()
)


def build_request() -> dict[str, Any]:
    """A build request as a foreign producer sends it, naming an entity, a source and a
    position."""
    message = request_message(
        "c-1",
        REPLY_TO,
        policy={"total_token_budget": 500, "sources": [{"name": "memory", "token_budget": 200}]},
        read_after="6/2E8CEED0",
    )
    message["request"]["entities"] = [{"kind": "crm.company", "id": "acme"}]
    return message


def test_the_committed_schemas_are_what_the_code_generates() -> None:
    generated = documents()
    for name, text in generated.items():
        assert (DOCS / name).read_text() == text, (
            f"docs/schemas/{name} is stale: run python -m devstack.json_schemas"
        )
    assert sorted(p.name for p in DOCS.glob("*.json")) == sorted(generated)


def schema(name: str) -> Draft202012Validator:
    body = json.loads((DOCS / f"{name}.schema.json").read_text())
    Draft202012Validator.check_schema(body)
    assert body["$id"] == f"{name}.schema.json"  # resolves inside the folder
    return Draft202012Validator(body, format_checker=FormatChecker())


def test_every_file_is_a_draft_2020_12_schema_with_its_own_id() -> None:
    for name in documents():
        schema(name.removesuffix(".schema.json"))


READ: dict[str, dict[str, Any]] = {
    "build-request": build_request(),
    "upload-request": {
        "correlation_id": "u-1",
        "reply_to": REPLY_TO,
        "scope": "organization",
        "organization_id": ORG,
        "title": "Pricing",
        "media_type": "text/markdown",
        "idempotency_key": "k-1",
        "uri": "docs://handbook/pricing",
        "content": {"text": "# Pricing"},
    },
    "reingest-request": {
        "action": "reingest",
        "scope": "organization",
        "organization_id": ORG,
        "source_id": str(uuid.uuid4()),
        "idempotency_key": "k-2",
    },
    "embed-batch": {
        "organization_id": ORG,
        "source_id": str(uuid.uuid4()),
        "generation": 1,
        "embedding_model": "all-MiniLM-L6-v2",
        "chunks": [{"ordinal": 0, "section": "Pricing", "text": "20 euros", "tokens": 4}],
    },
    "memory-remember": remember_message(
        "m-1", REPLY_TO, PRINCIPAL, attribute="preference.language", text="Welsh"
    ),
    "memory-forget": {
        "action": "forget",
        "correlation_id": "m-2",
        "reply_to": REPLY_TO,
        "idempotency_key": "k-4",
        "principal": PRINCIPAL.model_dump(mode="json", exclude_defaults=True),
        "memory_id": str(uuid.uuid4()),
    },
}


@pytest.mark.parametrize("name", sorted(READ))
def test_what_the_service_reads_validates_and_what_it_refuses_does_not(name: str) -> None:
    validator = schema(name)
    message = READ[name]
    model = next(m.model for m in MESSAGES if m.name == name)
    model.model_validate(message)  # the service accepts it
    assert not list(validator.iter_errors(message))
    assert list(validator.iter_errors({**message, "subject_key": "x"})), "an unknown field"
    required = sorted(validator.schema.get("required", []))
    assert required, f"{name} requires nothing"
    missing = {k: v for k, v in message.items() if k != required[0]}
    assert list(validator.iter_errors(missing)), f"without {required[0]}"


def test_formats_are_checked_as_ajv_checks_them_in_the_node_test() -> None:
    bad = {**READ["memory-forget"], "memory_id": "not-a-uuid"}
    assert list(schema("memory-forget").iter_errors(bad))


def test_a_malformed_position_is_refused_by_the_schema_as_by_the_service() -> None:
    validator = schema("build-request")
    for bad in ("latest", "6/2E8CEED0; DROP", "123456789/0"):
        assert list(validator.iter_errors({**READ["build-request"], "read_after": bad}))


def memory_revision() -> AgentMemory:
    return AgentMemory(
        id=uuid.uuid4(),
        organization_id=uuid.UUID(ORG),
        definition_id=uuid.uuid4(),
        scope="user",
        user_id=uuid.uuid4(),
        subject_key="user:u:preference.language",
        text="Welsh",
        subject_refs=[],
        proposed_by_run_id=None,
        supersedes_id=None,
        forgotten_at=None,
        created_at=datetime.now(UTC),
    )


SENT: dict[str, list[BaseModel]] = {
    "build-reply": [
        BuildReplyV1.ok(
            "c-1",
            ContextBrief(
                text="## Facts\n- Acme is a customer",
                items=[ResourceRef(kind="crm.company", id="acme")],
                tokens=9,
                per_source_tokens={"application": 9},
                dropped={},
                failed_sources=[],
            ),
        ),
        BuildReplyV1.failed("c-2", ErrorInfo(code="throttled", message="slow", retry_after_ms=9)),
        BuildReplyV1(correlation_id="c-3", status="reuse_previous"),
    ],
    "memory-answer": [
        MemoryAnswerV1.of(
            "m-1", Written(change="created", memory=memory_revision()), position="0/1"
        ),
        MemoryAnswerV1(correlation_id="m-2", status="refused", reason="quota", message="full"),
    ],
    "upload-status": [
        UploadStatusV1(
            correlation_id="u-1",
            status="ready",
            source_id=uuid.uuid4(),
            generation=1,
            chunks=3,
            position="6/2E8CEED0",
        ),
        UploadStatusV1(correlation_id="u-2", status="rejected", reason="no", details=["why"]),
    ],
    "dead-letter": [
        DeadLetterV1(
            topic="contextcore.build-request",
            partition=0,
            offset=7,
            consumer_group="contextcore-build",
            cause="not_json",
            reason="not JSON",
            payload="{",
            payload_bytes=1,
            payload_sha256="0" * 64,
        )
    ],
}


@pytest.mark.parametrize("name", sorted(SENT))
def test_what_the_service_sends_validates(name: str) -> None:
    validator = schema(name)
    for message in SENT[name]:
        sent = json.loads(message.model_dump_json())  # as it goes on the wire
        assert not list(validator.iter_errors(sent)), sent
    assert list(validator.iter_errors({**sent, "surprise": 1})), "an unknown field"


def test_every_message_of_the_generator_is_exercised_here() -> None:
    assert {m.name for m in MESSAGES} == set(READ) | set(SENT)


def as_text(headers: list[tuple[str, bytes]]) -> dict[str, str]:
    return {name: value.decode() for name, value in headers}


def test_the_header_schemas_hold_what_the_runtime_and_the_clients_write() -> None:
    """The headers as the code writes them validate; the bounds the code keeps are the
    schemas' (a value past them is refused)."""
    record = Inbound("contextcore.build-request", 0, 7, None, b"{", ())
    _, written = dead_letter(
        record,
        cause="not_json",
        reason="not JSON",
        consumer_group="build",
        payload_limit=100,
        max_bytes=10_000,
    )
    letters = schema("dead-letter-headers")
    assert not list(letters.iter_errors(as_text(written)))
    assert list(letters.iter_errors(as_text(written[:-1])))  # the cause is required

    requests = schema("request-headers")
    for organization in (uuid.UUID(ORG), None):  # None: the platform's lane
        assert not list(requests.iter_errors(as_text([organization_header(organization)])))
    assert list(requests.iter_errors({HEADER_ORGANIZATION: "acme"}))
    assert list(requests.iter_errors({"traceparent": "0" * (MAX_TRACE_HEADER + 1)}))

    retries = schema("retry-headers")
    retried = {HEADER_ATTEMPT: "2", HEADER_LAST_ERROR: "x" * MAX_LAST_ERROR_CHARS}
    assert not list(retries.iter_errors(retried))
    too_long = "x" * (MAX_LAST_ERROR_CHARS + 1)
    assert list(retries.iter_errors({**retried, HEADER_LAST_ERROR: too_long}))


def in_components(schema: Any) -> Any:
    """A docs/schemas body with its ``$defs`` references as AsyncAPI's components write them."""
    text = json.dumps(schema).replace('"#/$defs/', '"#/components/schemas/')
    return as_asyncapi(json.loads(text))


def test_the_asyncapi_payloads_are_these_schemas() -> None:
    """Each message's schema in docs/asyncapi/ is its file here, its nested types included
    (AsyncAPI's documents write a discriminator as the property's name)."""
    components: dict[str, Any] = {}
    for text in asyncapi_documents().values():
        components |= yaml.safe_load(text)["components"]["schemas"]
    for message in MESSAGES:
        body = json.loads((DOCS / f"{message.name}.schema.json").read_text())
        nested = body.pop("$defs", {})
        for key in ("$schema", "$id", "$comment"):
            body.pop(key)
        assert components[message.model.__name__] == in_components(body), message.name
        for name, schema in nested.items():
            assert components[name] == in_components(schema), f"{message.name}: {name}"
