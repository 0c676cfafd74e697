"""The committed AsyncAPI documents are what the code generates (python -m devstack.asyncapi)."""

from __future__ import annotations

import yaml

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


def test_each_consumer_reads_the_payload_it_declares_not_one_inferred() -> None:
    """The topic a consumer reads carries its declared model (a union of two actions for the
    upload and memory topics); FastStream, inferring it from a rewritten type hint, had named
    one arm of the union (InlineContent, ForgetV1) instead."""
    for name, payload in (
        ("build.yaml", "BuildRequestV1"),
        ("upload.yaml", "UploadTopicV1"),
        ("embed.yaml", "EmbedBatchV1"),
        ("memory.yaml", "MemoryWriteV1"),
    ):
        spec = yaml.safe_load(documents()[name])
        [read] = [op for op in spec["operations"].values() if op["action"] == "receive"]
        channel = read["channel"]["$ref"].rsplit("/", 1)[1]
        [message] = spec["channels"][channel]["messages"].values()
        key = message["$ref"].rsplit("/", 1)[1]
        assert spec["components"]["messages"][key]["payload"] == {
            "$ref": f"#/components/schemas/{payload}"
        }
        assert payload in spec["components"]["schemas"]
