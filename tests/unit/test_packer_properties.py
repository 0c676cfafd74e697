"""Property-based tests of the packer (hypothesis): caps, order independence, no forged sections."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from contextcore.packer import (
    DROP_REASONS,
    NOT_ENABLED,
    NOTICE_PREFIX,
    OUTRANKED,
    SECTION_HEADINGS,
    ContextPacker,
)
from contextcore.tokens import estimate_tokens
from schemas.context import (
    CLASS_ORDER,
    ContextItem,
    ContextPolicy,
    ContextSourceSpec,
    ResourceRef,
)

SOURCES = [f"s{i}" for i in range(4)]
text = st.text(
    alphabet=st.sampled_from(list("ab# -:[]\n\r\x0b\x0c\x1c\x85\u2028\u2029\t 日😀")), max_size=40
)
items = st.lists(
    st.builds(
        ContextItem,
        source=st.sampled_from([*SOURCES, "stranger"]),
        kind=st.sampled_from(CLASS_ORDER),
        title=text,
        body=text,
        subject_key=st.one_of(st.none(), st.sampled_from(["", "k:1:a", "k:1:b", "k:2:a"])),
        ref=st.one_of(
            st.none(),
            st.builds(
                ResourceRef, kind=st.sampled_from(["crm.company", "a b"]), id=st.sampled_from("12")
            ),
        ),
        tokens=st.integers(0, 30),
        rank_in_section=st.integers(-2, 2),
    ),
    max_size=40,
)
policies = st.builds(
    ContextPolicy,
    sources=st.permutations(SOURCES).flatmap(
        lambda names: st.tuples(
            *(
                st.builds(
                    ContextSourceSpec,
                    name=st.just(n),
                    enabled=st.booleans(),
                    token_budget=st.integers(0, 200),
                )
                for n in names
            )
        ).map(list)
    ),
    total_token_budget=st.integers(0, 400),
    page_order=st.permutations(CLASS_ORDER).map(lambda kinds: list(kinds[:3])),
)
failed = st.lists(text, max_size=3)


def interleave(batch: list[ContextItem], seed: int) -> list[ContextItem]:
    """Another answer order: sources interleaved differently, each source's own order kept."""
    per_source: dict[str, list[ContextItem]] = {}
    for it in batch:
        per_source.setdefault(it.source, []).append(it)
    rng = random.Random(seed)
    queues = list(per_source.values())
    out: list[ContextItem] = []
    while queues:
        queue = rng.choice(queues)
        out.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return out


@settings(max_examples=300, deadline=None)
@given(items, policies, failed)
def test_caps_are_never_exceeded(
    batch: list[ContextItem], policy: ContextPolicy, failures: list[str]
) -> None:
    brief = ContextPacker().pack(batch, policy, failed_sources=failures)
    budgets = {s.name: s.token_budget for s in policy.sources if s.enabled}
    for source, spent in brief.per_source_tokens.items():
        assert spent <= budgets.get(source, 0)
    notice = brief.text.splitlines()[0] if failures else None
    notice_tokens = estimate_tokens(notice + "\n") if notice else 0
    assert brief.tokens - notice_tokens <= policy.total_token_budget
    assert estimate_tokens(brief.text) <= brief.tokens  # the true cost is never under-reported
    assert set(brief.per_source_tokens) == set(brief.dropped) == {i.source for i in batch}


@settings(max_examples=300, deadline=None)
@given(items, policies, failed)
def test_the_drop_reasons_add_up_to_the_dropped_counts(
    batch: list[ContextItem], policy: ContextPolicy, failures: list[str]
) -> None:
    heard: list[Mapping[tuple[str, str], int]] = []
    brief = ContextPacker().pack(batch, policy, failed_sources=failures, on_drops=heard.append)
    assert brief == ContextPacker().pack(batch, policy, failed_sources=failures)
    by_source: Counter[str] = Counter()
    for drops in heard:
        for (source, reason), count in drops.items():
            assert reason in DROP_REASONS
            assert count > 0
            by_source[source] += count
    assert len(heard) <= 1
    assert by_source == Counter({s: n for s, n in brief.dropped.items() if n})


def _reason_of(outcome: str) -> str:
    """The metric's reason for a manifest outcome."""
    if outcome == "source_not_enabled":
        return NOT_ENABLED
    if outcome.startswith("lost_key_to:"):
        return OUTRANKED
    return outcome


@settings(max_examples=150, deadline=None)
@given(items, policies, failed, st.integers())
def test_the_manifest_accounts_for_every_item_as_the_brief_counts_it(
    batch: list[ContextItem], policy: ContextPolicy, failures: list[str], seed: int
) -> None:
    packer = ContextPacker()
    heard: list[Mapping[tuple[str, str], int]] = []
    brief, entries = packer.pack_explained(
        batch, policy, failed_sources=failures, on_drops=heard.append
    )
    assert brief == packer.pack(batch, policy, failed_sources=failures)
    # one entry per item
    assert Counter((e.source, e.kind, e.subject_key) for e in entries) == Counter(
        (i.source, i.kind, i.subject_key) for i in batch
    )
    # the counts of the brief: dropped per source, tokens per source, the reasons heard
    kept = [e for e in entries if e.outcome == "kept"]
    assert Counter(e.source for e in entries if e.outcome != "kept") == Counter(
        {s: n for s, n in brief.dropped.items() if n}
    )
    spent: Counter[str] = Counter()
    for entry in kept:
        spent[entry.source] += entry.tokens
    assert spent == Counter({s: n for s, n in brief.per_source_tokens.items() if n})
    assert all(e.tokens == 0 for e in entries if e.outcome != "kept")
    reasons = Counter((e.source, _reason_of(e.outcome)) for e in entries if e.outcome != "kept")
    assert reasons == Counter(heard[0] if heard else {})
    # a loser names the item that holds its key, and that item came earlier in pack order
    for place, entry in enumerate(entries):
        if entry.outcome.startswith("lost_key_to:"):
            winner = entry.outcome.removeprefix("lost_key_to:")
            assert any(
                f"{e.source}:{e.ref}".removesuffix(":None") == winner
                and e.subject_key == entry.subject_key
                for e in entries[:place]
            )
    # the manifest, like the brief, does not depend on the order the sources answered
    assert packer.pack_explained(interleave(batch, seed), policy, failed_sources=failures)[1] == (
        entries
    )


@settings(max_examples=100, deadline=None)
@given(items, policies)
def test_an_item_is_over_the_total_only_when_the_total_binds_and_over_its_source_likewise(
    batch: list[ContextItem], policy: ContextPolicy
) -> None:
    packer = ContextPacker()
    roomy_total = policy.model_copy(update={"total_token_budget": 10**6})
    _, entries = packer.pack_explained(batch, roomy_total)
    assert "over_total_budget" not in {e.outcome for e in entries}
    roomy_sources = policy.model_copy(
        update={"sources": [s.model_copy(update={"token_budget": 10**6}) for s in policy.sources]}
    )
    _, entries = packer.pack_explained(batch, roomy_sources)
    assert "over_source_budget" not in {e.outcome for e in entries}


@settings(max_examples=300, deadline=None)
@given(items, policies, failed, st.integers())
def test_output_does_not_depend_on_the_order_sources_answered(
    batch: list[ContextItem], policy: ContextPolicy, failures: list[str], seed: int
) -> None:
    packer = ContextPacker()
    assert packer.pack(batch, policy, failed_sources=failures) == packer.pack(
        interleave(batch, seed), policy, failed_sources=failures
    )


@settings(max_examples=300, deadline=None)
@given(items, policies, failed)
def test_no_line_starts_a_section_unless_the_packer_wrote_it(
    batch: list[ContextItem], policy: ContextPolicy, failures: list[str]
) -> None:
    brief = ContextPacker().pack(batch, policy, failed_sources=failures)
    lines = brief.text.split("\n") if brief.text else []
    headings = set(SECTION_HEADINGS.values())
    for index, line in enumerate(lines):
        if index == 0 and failures:
            assert line.startswith(NOTICE_PREFIX)
        elif line.startswith("#"):
            assert line in headings
        else:
            assert line.startswith("- ")
    assert len([line for line in lines if line in headings]) == len(
        {line for line in lines if line in headings}
    )
