"""Ingestion's own logic on in-memory ports (contextcore/knowledge/ingest.py): the order of its
steps, every answer of a redelivery, a replaced or deleted generation, and each way a document
fails. The SQL behind the repository, the sandbox's bounds and the object readers are tested
against PostgreSQL, real worker processes and real files and S3 (tests/integration/)."""

from __future__ import annotations

import base64
import uuid
from dataclasses import replace

import pytest

from contextcore.knowledge.addresses import (
    ObjectError,
    ObjectUnavailable,
)
from contextcore.knowledge.extract import Limits, Section
from contextcore.knowledge.ingest import (
    Ingestion,
    Prepared,
    Reingest,
    Upload,
)
from contextcore.knowledge.state import DELETED, Superseded
from tests.unit.knowledge_fakes import LIVE, NEXT, WINDOW, Objects, Sources, Words

ORG = uuid.UUID("7b000000-0000-4000-8000-0000000000a1")


def ingestion(
    sources: Sources, objects: Objects | None = None, cutter: Words | None = None, *,
    models: tuple[str, ...] = (LIVE, NEXT), limits: Limits | None = None,
) -> Ingestion:  # fmt: skip
    windows = dict.fromkeys(models, WINDOW)
    return Ingestion(
        sources, objects or Objects(), cutter or Words(), windows.get, batch_size=2, limits=limits
    )


def upload(key: str = "k1", text: str | None = "one two three", **fields: object) -> Upload:
    base: dict[str, object] = {
        "organization_id": ORG, "title": "Guide", "media_type": "text/plain", "upload_key": key,
        "uri": "docs://guide", "text": text, "reply_to": "replies", "correlation_id": f"c-{key}",
    }  # fmt: skip
    return Upload(**{**base, **fields})  # type: ignore[arg-type]


def words(prepared: Prepared) -> list[tuple[str, list[str]]]:
    return [(b.model, [c.text for c in b.chunks]) for b in prepared.batches]


async def test_an_upload_is_cut_recorded_and_handed_on_in_batches_per_model() -> None:
    sources = Sources()
    prepared = await ingestion(sources).prepare(upload())
    assert prepared.superseded is None
    assert prepared.source.status == "pending"
    assert words(prepared) == [(LIVE, ["one", "two"]), (LIVE, ["three"])]
    assert sources.calls == ["open_upload", "record_text"]
    state = sources.rows[prepared.source.id]
    assert state.sections == [Section(("Guide",), ["one two three"])]
    assert sources.expected[state.id, 1] == {LIVE: 3}


async def test_during_a_switch_the_chunks_are_cut_for_both_models() -> None:
    sources = Sources()
    sources.next = NEXT
    prepared = await ingestion(sources).prepare(upload(text="a b"))
    assert words(prepared) == [(LIVE, ["a", "b"]), (NEXT, ["a", "b"])]


async def test_a_redelivered_upload_cuts_its_stored_text_and_hands_the_same_batches_on() -> None:
    sources, cutter = Sources(), Words()
    first = await ingestion(sources, cutter=cutter).prepare(upload())
    again = await ingestion(sources, cutter=cutter).prepare(upload())
    assert words(again) == words(first)  # the embedding group stores each chunk once
    assert cutter.calls[1][0] is None  # from the stored sections, not the document
    assert sources.calls[-2:] == ["open_upload", "source"]  # nothing recorded twice


async def test_a_finished_source_is_answered_with_its_status_and_nothing_else() -> None:
    sources, cutter = Sources(), Words()
    first = await ingestion(sources, cutter=cutter).prepare(upload())
    sources.rows[first.source.id] = replace(sources.rows[first.source.id], status="ready")
    again = await ingestion(sources, cutter=cutter).prepare(upload())
    assert (again.source.status, again.batches, again.superseded) == ("ready", [], None)
    assert len(cutter.calls) == 1


async def test_a_redelivery_after_a_later_upload_of_the_document_is_superseded() -> None:
    sources = Sources()
    await ingestion(sources).prepare(upload("k1"))
    later = await ingestion(sources).prepare(upload("k2"))
    again = await ingestion(sources).prepare(upload("k1"))
    assert again.batches == []
    assert again.superseded == Superseded(later.source.id, 2)


async def test_the_uploader_of_a_replaced_pending_generation_is_told() -> None:
    sources = Sources()
    first = await ingestion(sources).prepare(upload("k1"))
    told: list[Superseded] = []

    async def tell(replaced: Superseded) -> None:
        told.append(replaced)

    await ingestion(sources).prepare(upload("k2"), replaced=tell)
    assert told == [Superseded(first.source.id, 2, 1, "replies", "c-k1")]


async def test_a_generation_replaced_while_it_was_cut_is_superseded_without_batches() -> None:
    sources, cutter = Sources(), Words()
    running = ingestion(sources, cutter=cutter)

    async def a_later_upload() -> None:
        cutter.during.clear()
        await ingestion(sources, cutter=cutter).prepare(upload("k2"))

    cutter.during.append(a_later_upload)
    prepared = await running.prepare(upload("k1"))
    assert prepared.batches == []
    assert prepared.superseded is not None
    assert (prepared.superseded.by_generation, prepared.superseded.generation) == (2, 1)


async def test_a_document_deleted_while_it_was_cut_is_answered_failed_deleted() -> None:
    sources, cutter = Sources(), Words()

    async def delete() -> None:
        sources.rows.clear()

    cutter.during.append(delete)
    prepared = await ingestion(sources, cutter=cutter).prepare(upload())
    assert (prepared.source.status, prepared.source.status_reason) == ("failed", DELETED)
    assert prepared.batches == []


async def test_a_document_with_no_text_fails_its_generation_with_the_reason() -> None:
    sources = Sources()
    prepared = await ingestion(sources).prepare(upload(text="   "))
    assert (prepared.source.status, prepared.source.status_reason) == (
        "failed", "the document has no text"
    )  # fmt: skip
    assert prepared.batches == []


async def test_inline_base64_that_is_not_base64_fails_the_source() -> None:
    prepared = await ingestion(Sources()).prepare(upload(text=None, base64="not base64!"))
    assert prepared.source.status_reason == "the inline content is not valid base64"
    ok = await ingestion(Sources()).prepare(
        upload(text=None, base64=base64.b64encode(b"fine words").decode())
    )
    assert words(ok) == [(LIVE, ["fine", "words"])]


async def test_a_refused_address_stores_nothing_and_a_missing_object_fails_the_source() -> None:
    sources = Sources()
    with pytest.raises(ObjectError, match="does not read"):
        await ingestion(sources).prepare(upload(uri=None, text=None, object="file:///etc/passwd"))
    assert sources.calls == []  # refused before a source exists
    with pytest.raises(ObjectError, match="no query"):
        await ingestion(sources).prepare(upload(uri=None, text=None, object="file:///docs/a?x"))
    prepared = await ingestion(sources).prepare(
        upload(uri=None, text=None, object="file:///docs/missing.txt")
    )
    assert prepared.source.status_reason == "no such object"


async def test_an_object_store_that_does_not_answer_is_retried_then_fails_the_source() -> None:
    sources, objects = Sources(), Objects({"/docs/a.txt": b"alpha beta"})
    objects.down = True
    address = upload(uri=None, text=None, object="file:///docs/a.txt")
    with pytest.raises(ObjectUnavailable):
        await ingestion(sources, objects).prepare(address)
    prepared = await ingestion(sources, objects).prepare(address, last_attempt=True)
    assert prepared.source.status_reason == (
        "the object store did not answer (after the last attempt)"
    )
    objects.down = False
    fresh = await ingestion(Sources(), objects).prepare(address)
    assert words(fresh) == [(LIVE, ["alpha", "beta"])]


async def test_a_model_this_process_cannot_cut_for_fails_the_source() -> None:
    sources = Sources()
    sources.next = NEXT
    prepared = await ingestion(sources, models=(LIVE,)).prepare(upload())
    assert prepared.source.status_reason == (f"this service cannot cut text for the model {NEXT!r}")


async def test_a_retry_starts_a_new_generation_from_the_stored_text() -> None:
    sources, cutter = Sources(), Words()
    first = await ingestion(sources, cutter=cutter).prepare(upload())
    retry = Reingest(ORG, first.source.id, "retry-1", reply_to="replies", correlation_id="r1")
    prepared = await ingestion(sources, cutter=cutter).reingest(retry)
    assert isinstance(prepared, Prepared)
    assert prepared.source.generation == 2
    assert words(prepared) == words(first)
    assert cutter.calls[-1][0] is None  # from the stored sections
    assert sources.expected[first.source.id, 2] == {LIVE: 3}


async def test_a_retry_whose_text_no_longer_cuts_fails_its_new_generation_at_once() -> None:
    """A retry commits a new pending generation before it cuts: a cut that fails (a chunk limit
    lowered since the upload, issue 32) fails that generation, where it was left pending for the
    sweep. A switch's step that fails leaves the source as it is, and says why."""
    sources = Sources()
    first = await ingestion(sources).prepare(upload())
    lowered = Limits(max_chunks=2)
    step = Reingest(ORG, first.source.id, "switch-1", models=(NEXT,))
    said = await ingestion(sources, limits=lowered).reingest(step)
    assert said == "the document makes more than 2 passages"
    assert sources.rows[first.source.id].generation == 1
    retry = Reingest(ORG, first.source.id, "retry-1", reply_to="replies", correlation_id="r1")
    prepared = await ingestion(sources, limits=lowered).reingest(retry)
    assert isinstance(prepared, Prepared)
    assert (prepared.source.generation, prepared.source.status) == (2, "failed")
    assert prepared.source.status_reason == "the document makes more than 2 passages"
    assert prepared.batches == []


async def test_a_switchs_first_step_cuts_the_current_generation_for_the_new_model_only() -> None:
    sources = Sources()
    first = await ingestion(sources).prepare(upload())
    sources.rows[first.source.id] = replace(sources.rows[first.source.id], status="ready")
    step = Reingest(ORG, first.source.id, "switch-1", models=(NEXT,))
    prepared = await ingestion(sources).reingest(step)
    assert isinstance(prepared, Prepared)
    assert prepared.source.generation == 1  # no new generation
    assert words(prepared) == [(NEXT, ["one", "two"]), (NEXT, ["three"])]


async def test_a_reingest_without_a_source_or_its_text_says_why() -> None:
    sources = Sources()
    missing = Reingest(ORG, uuid.uuid4(), "r-missing")
    assert await ingestion(sources).reingest(missing) == "no such source"
    failed = await ingestion(sources).prepare(upload(text=" "))
    no_text = Reingest(ORG, failed.source.id, "r-no-text")
    assert "has no stored text" in str(await ingestion(sources).reingest(no_text))
    again = Reingest(ORG, failed.source.id, "r-no-text")  # a redelivery says the same
    assert "has no stored text" in str(await ingestion(sources).reingest(again))
