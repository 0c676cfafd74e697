"""The committed AsyncAPI documents are what the code generates (python -m devstack.asyncapi)."""

from __future__ import annotations

from devstack.asyncapi import DOCS, documents


def test_the_committed_asyncapi_documents_match_the_code() -> None:
    for name, text in documents().items():
        committed = (DOCS / name).read_text()
        assert committed == text, f"docs/asyncapi/{name} is stale: run python -m devstack.asyncapi"


def test_the_build_document_names_every_channel_and_payload() -> None:
    build = documents()["build.yaml"]
    for expected in (
        "address: contextcore.build-request",
        "address: contextcore.build-request.dlt",
        "address: '{reply_to}'",
        "$ref: '#/components/schemas/BuildRequestV1'",
        "$ref: '#/components/schemas/BuildReplyV1'",
        "$ref: '#/components/schemas/DeadLetterV1'",
    ):
        assert expected in build
