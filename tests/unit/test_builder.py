"""The builder: concurrent, time-boxed reads; failures reported, never hidden."""

from __future__ import annotations

import asyncio
import hashlib
import math
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from contextcore.builder import (
    DefaultContextBuilder,
    ReadCause,
    RequiredContextSourceError,
    policy_fingerprint,
)
from contextcore.packer import NOTICE_PREFIX, ContextPacker
from contextcore.registry import ContextSource, ContextSourceRegistry
from schemas.context import ContextPolicy, ContextRequest, ContextSubject, ResourceRef
from tests.unit.fakes import StaticSource, item

REQUEST = ContextRequest(
    subject=ContextSubject(
        organization_id=uuid.uuid4(), user_id=None, trigger_id=None, definition_id=None
    ),
    query="q",
    entities=(),
)


def policy(*specs: dict[str, Any], total: int = 1000) -> ContextPolicy:
    return ContextPolicy.model_validate(
        {
            "total_token_budget": total,
            "sources": [{"token_budget": 100, **spec} for spec in specs],
        }
    )


def builder(*sources: StaticSource, timeout: float = 1.0) -> DefaultContextBuilder:
    return DefaultContextBuilder(
        ContextSourceRegistry(sources), ContextPacker(), source_timeout_s=timeout
    )


class CountingRegistry(ContextSourceRegistry):
    def __init__(self, sources: list[StaticSource]) -> None:
        super().__init__(sources)
        self.resolved: list[str] = []

    def get(self, name: str) -> ContextSource | None:
        self.resolved.append(name)
        return super().get(name)


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, -math.inf, True])
def test_a_zero_negative_nan_or_infinite_timeout_fails_construction(timeout: float) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        builder(timeout=timeout)


async def test_an_empty_or_all_disabled_policy_returns_an_empty_brief() -> None:
    source = StaticSource("a", [item("a")])
    assert (await builder(source).build(REQUEST, policy())).text == ""
    brief = await builder(source).build(REQUEST, policy({"name": "a", "enabled": False}))
    assert (brief.text, brief.items, brief.failed_sources) == ("", [], [])
    assert source.calls == 0


async def test_a_disabled_source_is_never_resolved_or_read() -> None:
    off, on = StaticSource("off", [item("off")]), StaticSource("on", [item("on")])
    registry = CountingRegistry([off, on])
    brief = await DefaultContextBuilder(registry, ContextPacker()).build(
        REQUEST, policy({"name": "off", "enabled": False}, {"name": "on"})
    )
    assert registry.resolved == ["on"]
    assert off.calls == 0
    assert brief.per_source_tokens.keys() == {"on"}


async def test_an_optional_failure_lands_in_failed_sources_and_the_build_goes_on() -> None:
    broken = StaticSource("broken", error=RuntimeError("db down"))
    fine = StaticSource("fine", [item("fine", body="still here")])
    brief = await builder(broken, fine).build(REQUEST, policy({"name": "broken"}, {"name": "fine"}))
    assert brief.failed_sources == ["broken"]
    assert brief.text.splitlines()[0] == NOTICE_PREFIX + "broken"
    assert "still here" in brief.text


async def test_an_optional_timeout_and_a_missing_optional_source_both_land_in_failed() -> None:
    slow = StaticSource("slow", [item("slow")], delay=5)
    brief = await builder(slow, timeout=0.05).build(
        REQUEST, policy({"name": "slow"}, {"name": "not_registered"})
    )
    assert brief.failed_sources == ["slow", "not_registered"]
    assert slow.cancelled


async def test_a_required_failure_fails_the_run_and_every_failed_required_source_is_named() -> None:
    sources = [
        StaticSource("r1", error=RuntimeError("boom")),
        StaticSource("opt", error=RuntimeError("ignored")),
        StaticSource("ok", [item("ok")]),
        StaticSource("r2", delay=5),
    ]
    with pytest.raises(RequiredContextSourceError) as raised:
        await builder(*sources, timeout=0.05).build(
            REQUEST,
            policy(
                {"name": "r2", "required": True},
                {"name": "opt"},
                {"name": "ok"},
                {"name": "r1", "required": True},
                {"name": "gone", "required": True},
            ),
        )
    assert raised.value.sources == ["r2", "r1", "gone"]
    assert raised.value.reasons[:2] == ["timed out", "failed (RuntimeError)"]  # never its text
    assert "not registered" in raised.value.reasons[2]


async def test_a_source_item_that_names_another_source_fails_its_source() -> None:
    liar = StaticSource("liar", [item("liar"), item("someone_else", body="smuggled")])
    brief = await builder(liar).build(REQUEST, policy({"name": "liar"}, {"name": "someone_else"}))
    assert brief.failed_sources == ["liar", "someone_else"]
    assert "smuggled" not in brief.text


async def test_a_blocked_source_does_not_stop_another_from_starting_and_order_is_policy_order() -> (
    None
):
    gate = asyncio.Event()

    class Blocked(StaticSource):
        async def retrieve(self, request: Any, spec: Any) -> Any:
            self.started.set()
            await gate.wait()
            return [item(self.name, body="first in policy")]

    blocked = Blocked("blocked")
    fast = StaticSource("fast", [item("fast", body="answered first")])
    build = asyncio.create_task(
        builder(blocked, fast).build(REQUEST, policy({"name": "blocked"}, {"name": "fast"}))
    )
    await asyncio.wait_for(fast.started.wait(), 1)
    assert blocked.started.is_set()
    gate.set()
    brief = await build
    lines = brief.text.splitlines()
    assert lines.index("- t: first in policy") < lines.index("- t: answered first")


async def test_cancelling_the_builder_cancels_active_reads_and_creates_no_brief() -> None:
    slow_a, slow_b = StaticSource("a", delay=10), StaticSource("b", delay=10)
    packed: list[object] = []

    class RecordingPacker(ContextPacker):
        def pack(self, *args: Any, **kwargs: Any) -> Any:
            packed.append(args)
            return super().pack(*args, **kwargs)

    build = asyncio.create_task(
        DefaultContextBuilder(
            ContextSourceRegistry([slow_a, slow_b]), RecordingPacker(), source_timeout_s=30
        ).build(REQUEST, policy({"name": "a"}, {"name": "b"}))
    )
    await asyncio.wait_for(asyncio.gather(slow_a.started.wait(), slow_b.started.wait()), 1)
    build.cancel()
    with pytest.raises(asyncio.CancelledError):
        await build
    await asyncio.sleep(0)
    assert slow_a.cancelled
    assert slow_b.cancelled
    assert packed == []


async def test_sources_are_read_concurrently() -> None:
    """Each read waits until all five have started: serial reads would all time out."""
    started: set[str] = set()
    everyone = asyncio.Event()

    class Rendezvous(StaticSource):
        async def retrieve(self, request: Any, spec: Any) -> Any:
            started.add(self.name)
            if len(started) == 5:
                everyone.set()
            await everyone.wait()
            return [item(self.name)]

    sources = [Rendezvous(f"s{i}") for i in range(5)]
    brief = await builder(*sources, timeout=5).build(
        REQUEST, policy(*({"name": s.name} for s in sources))
    )
    assert brief.failed_sources == []
    assert len(brief.per_source_tokens) == 5


class Observer:
    def __init__(self) -> None:
        self.reads: list[tuple[str, float, ReadCause, bool]] = []
        self.drops: list[Mapping[tuple[str, str], int]] = []

    def source_read(self, source: str, seconds: float, cause: ReadCause, required: bool) -> None:
        self.reads.append((source, seconds, cause, required))

    def items_dropped(self, drops: Mapping[tuple[str, str], int]) -> None:
        self.drops.append(dict(drops))


async def test_the_observer_hears_every_read_with_its_cause_and_every_drop() -> None:
    observer = Observer()
    ticks = iter(range(100))
    sources = [
        StaticSource("ok", [item("ok", body="kept"), item("ok", body="x" * 2_000)]),
        StaticSource("broken", error=RuntimeError("db down")),
        StaticSource("slow", delay=5),
        StaticSource("liar", [item("someone_else")]),
    ]
    brief = await DefaultContextBuilder(
        ContextSourceRegistry(sources),
        ContextPacker(),
        source_timeout_s=0.05,
        observer=observer,
        clock=lambda: float(next(ticks)),
    ).build(
        REQUEST,
        policy(
            {"name": "ok"},
            {"name": "broken"},
            {"name": "slow", "required": False},
            {"name": "liar"},
            {"name": "gone", "required": False},
        ),
    )
    causes = {source: (cause, required) for source, _, cause, required in observer.reads}
    assert causes == {
        "ok": ("ok", False),
        "broken": ("error", False),
        "slow": ("timeout", False),
        "liar": ("wrong_source", False),
        "gone": ("missing", False),
    }
    assert all(seconds >= 1 for _, seconds, _, _ in observer.reads)  # the clock ticked per read
    assert observer.drops == [{("ok", "over_source_budget"): 1}]
    assert brief.dropped == {"ok": 1}


async def test_a_cancelled_build_reports_no_read() -> None:
    observer = Observer()
    slow = StaticSource("a", delay=10)
    build = asyncio.create_task(
        DefaultContextBuilder(
            ContextSourceRegistry([slow]), ContextPacker(), source_timeout_s=30, observer=observer
        ).build(REQUEST, policy({"name": "a"}))
    )
    await asyncio.wait_for(slow.started.wait(), 1)
    build.cancel()
    with pytest.raises(asyncio.CancelledError):
        await build
    assert observer.reads == []


async def test_an_observer_that_raises_changes_no_brief() -> None:
    class Broken(Observer):
        def source_read(
            self, source: str, seconds: float, cause: ReadCause, required: bool
        ) -> None:
            raise RuntimeError("metrics down")

        def items_dropped(self, drops: Mapping[tuple[str, str], int]) -> None:
            raise RuntimeError("metrics down")

    sources = [StaticSource("ok", [item("ok", body="kept"), item("ok", body="x" * 2_000)])]
    plain = await builder(*sources).build(REQUEST, policy({"name": "ok"}))
    observed = await DefaultContextBuilder(
        ContextSourceRegistry(sources), ContextPacker(), observer=Broken()
    ).build(REQUEST, policy({"name": "ok"}))
    assert observed == plain
    assert observed.failed_sources == []


async def test_an_explained_build_is_the_same_brief_with_every_item_and_failure_accounted() -> None:
    company = ResourceRef(kind="crm.company", id="c1")
    sources = [
        StaticSource("app", [item("app", body="Acme", key="crm.company:c1:name", ref=company)]),
        StaticSource("dossier", [item("dossier", "dossier", key="crm.company:c1:name")]),
        StaticSource("broken", error=RuntimeError("db down")),
        StaticSource("slow", delay=5),
        StaticSource("liar", [item("someone_else")]),
    ]
    chosen = policy(
        {"name": "app"},
        {"name": "dossier"},
        {"name": "broken", "required": False},
        {"name": "slow", "required": False},
        {"name": "liar", "required": False},
        {"name": "gone", "required": False},
    )
    built = builder(*sources, timeout=0.05)
    brief, manifest = await built.build_explained(REQUEST, chosen)

    assert brief == await built.build(REQUEST, chosen)
    assert [(e.source, e.ref, e.tokens > 0, e.outcome) for e in manifest.items] == [
        ("app", "crm.company:c1", True, "kept"),
        ("dossier", None, False, "lost_key_to:app:crm.company:c1"),
    ]
    assert [(f.source, f.cause, f.timeout_ms, f.error) for f in manifest.failed_sources] == [
        ("broken", "error", None, "RuntimeError"),
        ("slow", "timeout", 50, None),
        ("liar", "wrong_source", None, None),
        ("gone", "missing", None, None),
    ]
    assert manifest.brief_sha256 == hashlib.sha256(brief.text.encode()).hexdigest()
    assert manifest.policy_sha256 == policy_fingerprint(chosen)


def test_a_policys_fingerprint_does_not_depend_on_the_order_of_its_json_keys() -> None:
    spec = {"name": "app", "token_budget": 10, "options": {"a": 1, "b": 2}}
    one = ContextPolicy.model_validate({"total_token_budget": 10, "sources": [spec]})
    flipped = {"options": {"b": 2, "a": 1}, "token_budget": 10, "name": "app"}
    other = ContextPolicy.model_validate({"sources": [flipped], "total_token_budget": 10})
    assert policy_fingerprint(one) == policy_fingerprint(other)
    assert policy_fingerprint(one) != policy_fingerprint(
        one.model_copy(update={"total_token_budget": 11})
    )
