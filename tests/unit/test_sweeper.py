"""The pending sweep's Sweeper on its tables in memory (tests/unit/knowledge_fakes.py): what it
fails and tells, what it counts, and its bounded batches, one session a sweep. The PostgreSQL
store's statements have their integration tests (tests/integration/test_knowledge_storage.py,
test_start_journal.py, test_reply_topics.py)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from broker.reply_topics import ReplyTopics
from broker.settings import TopicSettings
from consumers.knowledge.sweep.app import Sweeper, SweepSettings, SweepStore
from consumers.runtime.inmemory import MemoryBroker, MemoryPublisher
from contextcore.knowledge.state import SourceState
from tests.unit.knowledge_fakes import LIVE, NEXT, Chunks, Clock, Sources, SweepTables

ORG, OTHER = uuid.uuid4(), uuid.uuid4()
PREFIX = "unit.reply"
HOUR = 3600.0


class Rig:
    def __init__(self, **settings: Any) -> None:
        self.clock = Clock()
        self.sources = Sources(self.clock)
        self.chunks = Chunks(self.sources)
        self.tables = SweepTables(self.sources, self.chunks)
        self.broker = MemoryBroker()
        store: SweepStore = self.tables  # the fake is the port
        topics = TopicSettings.model_construct(reply_prefix=PREFIX)
        self.sweeper = Sweeper(
            SweepSettings.model_construct(metrics_port=0, **settings),
            store,
            MemoryPublisher(self.broker),
            CollectorRegistry(),
            reply_topics=ReplyTopics.of(topics),
        )

    def pending(
        self,
        organization_id: uuid.UUID | None = ORG,
        *,
        reply_to: str | None = f"{PREFIX}.a",
        correlation_id: str | None = "c-1",
        chunks: dict[str, int] | None = None,
    ) -> uuid.UUID:
        """A source whose upload is pending from now, expecting ``chunks`` under each model."""
        source_id = uuid.uuid4()
        self.sources.rows[source_id] = SourceState(
            id=source_id, organization_id=organization_id, title=f"doc {source_id}",
            status="pending", status_reason=None, generation=1, chunk_count=None,
            updated_at=self.clock.now(), reply_to=reply_to, correlation_id=correlation_id,
        )  # fmt: skip
        self.sources.pending_since[source_id] = self.clock.now()
        if chunks is not None:
            self.sources.expected[source_id, 1] = chunks
        return source_id

    def told(self, topic: str) -> list[dict[str, object]]:
        return [json.loads(record.value or b"") for record in self.broker.records(topic)]

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.sweeper.registry.get_sample_value(name, labels or {})


async def test_a_source_pending_over_an_hour_is_failed_and_its_uploader_told() -> None:
    rig = Rig()
    stale = rig.pending(reply_to=f"{PREFIX}.a", correlation_id="up-1", chunks={LIVE: 3})
    rig.clock.advance(HOUR + 60)
    fresh = rig.pending(reply_to=f"{PREFIX}.b", correlation_id="up-2", chunks={LIVE: 3})

    [swept] = await rig.sweeper.sweep_once()

    assert (swept.source_id, swept.organization_id, swept.embedding_model) == (stale, ORG, LIVE)
    assert swept.reason.startswith("pending for more than an hour (since ")
    assert swept.reason.endswith(f"): 0 of 3 chunks stored under {LIVE}")
    assert rig.sources.rows[stale].status == "failed"
    assert rig.sources.rows[stale].status_reason == swept.reason
    [told] = rig.told(f"{PREFIX}.a")
    assert told["correlation_id"] == "up-1"
    assert told["status"] == "failed"
    assert told["source_id"] == str(stale)
    assert told["reason"] == swept.reason
    assert rig.sources.rows[fresh].status == "pending"
    assert rig.told(f"{PREFIX}.b") == []
    assert await rig.sweeper.sweep_once() == [], "a failed source is not swept twice"
    assert rig.told(f"{PREFIX}.a") == [told]


async def test_the_hour_is_a_floor_whatever_the_settings_say() -> None:
    rig = Rig(older_than_s=60.0)  # model_construct: the settings' own floor not checked
    source = rig.pending()
    rig.clock.advance(HOUR - 60)
    assert await rig.sweeper.sweep_once() == []
    rig.clock.advance(120)
    assert [s.source_id for s in await rig.sweeper.sweep_once()] == [source]


async def test_the_reason_counts_the_stored_chunks_or_says_nothing_was_chunked() -> None:
    rig = Rig()
    partly = rig.pending(reply_to=f"{PREFIX}.a", chunks={LIVE: 2, NEXT: 4})
    rig.chunks.stored[partly, 1, NEXT] = {0}
    unchunked = rig.pending(reply_to=f"{PREFIX}.b")
    rig.clock.advance(2 * HOUR)
    reasons = {s.source_id: (s.embedding_model, s.reason) for s in await rig.sweeper.sweep_once()}
    assert NEXT < LIVE
    assert reasons[partly][0] == NEXT  # the first model by name, as the database's function
    assert reasons[partly][1].endswith(f"1 of 4 chunks stored under {NEXT}")
    assert reasons[unchunked][0] is None
    assert reasons[unchunked][1].endswith(") before its text was chunked")


async def test_each_uploader_hears_of_its_own_source_only_and_a_forbidden_topic_of_none() -> None:
    rig = Rig()
    ours = rig.pending(ORG, reply_to=f"{PREFIX}.ours", correlation_id="ours")
    theirs = rig.pending(OTHER, reply_to=f"{PREFIX}.theirs", correlation_id="theirs")
    platform = rig.pending(None, reply_to=None, correlation_id=None)  # nobody to tell
    forbidden = rig.pending(ORG, reply_to="not-a-reply-topic", correlation_id="refused")
    rig.clock.advance(2 * HOUR)

    swept = await rig.sweeper.sweep_once()

    assert {s.source_id for s in swept} == {ours, theirs, platform, forbidden}
    assert [(m["correlation_id"], m["source_id"]) for m in rig.told(f"{PREFIX}.ours")] == [
        ("ours", str(ours))
    ]
    assert [(m["correlation_id"], m["source_id"]) for m in rig.told(f"{PREFIX}.theirs")] == [
        ("theirs", str(theirs))
    ]
    assert rig.told("not-a-reply-topic") == []
    assert rig.sample("contextcore_knowledge_sources_swept_total") == 4


async def test_it_counts_the_sources_by_status_and_the_oldest_pending_after_each_sweep() -> None:
    rig = Rig()
    stale = rig.pending()
    rig.clock.advance(2 * HOUR)
    rig.pending()
    rig.clock.advance(600)
    ready = rig.pending()
    rig.sources.rows[ready] = replace(rig.sources.rows[ready], status="ready", chunk_count=3)

    await rig.sweeper.sweep_once()

    assert rig.sources.rows[stale].status == "failed"
    counts = {s: rig.sample("contextcore_knowledge_sources", {"status": s}) for s in
              ("pending", "ready", "failed")}  # fmt: skip
    assert counts == {"pending": 1, "ready": 1, "failed": 1}
    oldest = rig.sample("contextcore_knowledge_oldest_pending_seconds")
    assert oldest is not None
    assert 600 <= oldest < 660
    assert rig.sample("contextcore_sweep_last_success_timestamp_seconds")
    rig.clock.advance(2 * HOUR)
    await rig.sweeper.sweep_once()
    assert rig.sample("contextcore_knowledge_oldest_pending_seconds") == 0
    assert rig.sample("contextcore_knowledge_sources", {"status": "failed"}) == 2


async def test_it_counts_the_tenants_past_the_threshold_without_an_index() -> None:
    rig = Rig(index_min_chunks=100)
    rig.pending(ORG, chunks={LIVE: 60})
    rig.pending(ORG, chunks={LIVE: 50, NEXT: 10})
    rig.pending(OTHER, chunks={LIVE: 120})
    rig.pending(None, chunks={LIVE: 99})
    await rig.sweeper.sweep_once()
    assert rig.sample("contextcore_knowledge_tenants_without_index") == 2
    rig.tables.indexed.add((OTHER, LIVE))
    await rig.sweeper.sweep_once()
    assert rig.sample("contextcore_knowledge_tenants_without_index") == 1


async def test_stale_sources_go_in_bounded_batches_oldest_first_until_one_is_short() -> None:
    rig = Rig(batch=2)
    ids = []
    for _ in range(5):
        ids.append(rig.pending())
        rig.clock.advance(1)
    rig.clock.advance(2 * HOUR)

    swept = await rig.sweeper.sweep_once()

    assert [s.source_id for s in swept] == ids
    assert [b for call, b in rig.tables.calls if call == "fail_stale"] == [2, 2, 2]
    assert rig.tables.sessions == 1, "one session (one connection) a sweep"

    rig.tables.calls.clear()
    for _ in range(4):  # a multiple of the batch: one more call comes back empty
        rig.pending()
    rig.clock.advance(2 * HOUR)
    assert len(await rig.sweeper.sweep_once()) == 4
    assert [b for call, b in rig.tables.calls if call == "fail_stale"] == [2, 2, 2]


async def test_old_claims_and_journal_rows_go_in_batches_never_a_claim_under_a_day() -> None:
    day = timedelta(days=1)
    rig = Rig(prune_batch=2, ledger_retention_s=86_400.0, journal_retention_s=3_600.0)
    now = rig.clock.now()
    rig.tables.claims = [now - 3 * day] * 5 + [now - timedelta(hours=20)]
    rig.tables.journal = [now - timedelta(hours=2)] * 3 + [now - timedelta(minutes=5)]

    await rig.sweeper.sweep_once()

    assert rig.tables.claims == [now - timedelta(hours=20)]
    assert rig.tables.journal == [now - timedelta(minutes=5)]
    calls = [call for call, _ in rig.tables.calls if call.startswith("prune")]
    assert calls == ["prune_ledger"] * 3 + ["prune_journal"] * 2

    short = Rig(ledger_retention_s=3_600.0)  # asked for an hour: the day's floor holds
    short.tables.claims = [short.clock.now() - timedelta(hours=20)]
    await short.sweeper.sweep_once()
    assert len(short.tables.claims) == 1
