"""The per-organization source cache: keyed by organization, bounded, and never storing a read
that an invalidation overtook."""

from __future__ import annotations

import logging
import tracemalloc
import uuid

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from contextcore.cache import Generation, TenantCache
from contextcore.storage.invalidation import CacheInvalidator


def listening(**kwargs: object) -> TenantCache[str]:
    cache: TenantCache[str] = TenantCache("test", **kwargs)  # type: ignore[arg-type]
    cache.listening = True
    return cache


def test_nothing_is_cached_without_a_listener() -> None:
    cache: TenantCache[str] = TenantCache("test")
    org = uuid.uuid4()
    cache.put(org, "unlistened", generation=cache.generation(org))
    assert cache.get(org) is None


def test_it_expires_and_refuses_a_read_older_than_an_invalidation() -> None:
    now = [0.0]
    cache = listening(ttl_s=60, clock=lambda: now[0])
    org = uuid.uuid4()
    seen = cache.generation(org)
    cache.invalidate(org)  # a write lands while the read is in flight
    cache.put(org, "stale", generation=seen)
    assert cache.get(org) is None
    cache.put(org, "fresh", generation=cache.generation(org))
    assert cache.get(org) == "fresh"
    now[0] = 60.0
    assert cache.get(org) is None


def test_clear_outdates_a_read_in_flight_for_an_organization_never_seen() -> None:
    cache = listening()
    org = uuid.uuid4()
    seen = cache.generation(org)  # no entry, no generation of its own yet
    cache.clear()  # a platform row changed meanwhile
    cache.put(org, "stale", generation=seen)
    assert cache.get(org) is None


def test_an_entry_answers_only_its_own_organization_and_key() -> None:
    cache = listening()
    a, b = uuid.uuid4(), uuid.uuid4()
    cache.put(a, "a's", generation=cache.generation(a), key=5)
    assert cache.get(b, 5) is None
    assert cache.get(a, None) is None
    assert cache.get(a, 5) == "a's"
    cache.invalidate(b)
    assert cache.get(a, 5) == "a's"
    cache.invalidate(a)
    assert cache.get(a, 5) is None
    assert (cache.hits, cache.misses) == (2, 3)


def test_it_holds_at_most_max_entries_dropping_the_least_recently_used() -> None:
    cache = listening(max_entries=3)
    orgs = [uuid.uuid4() for _ in range(4)]
    for org in orgs[:3]:
        cache.put(org, str(org), generation=cache.generation(org))
    assert cache.get(orgs[0]) == str(orgs[0])  # now the most recently used
    cache.put(orgs[3], "new", generation=cache.generation(orgs[3]))
    assert len(cache) == 3
    assert cache.get(orgs[1]) is None  # the least recently used went
    assert [cache.get(o) for o in (orgs[0], orgs[2], orgs[3])] == [
        str(orgs[0]),
        str(orgs[2]),
        "new",
    ]
    with pytest.raises(ValueError, match="at least one"):
        TenantCache("empty", max_entries=0)


def test_a_flood_of_notifications_costs_bounded_memory() -> None:
    """Every notified id was kept forever: a million ``pg_notify`` calls naming new ids took a
    build consumer from 311 to 481 MB (issue 32). Now the generations of at most
    ``max_generations`` organizations are kept."""
    cache = listening()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200_000):
            cache.invalidate(uuid.uuid4())
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 5_000_000, f"200,000 notifications kept {grown / 1e6:.1f} MB"


Step = tuple[str, int]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["read", "invalidate", "put"] * 4 + ["clear"]), st.integers(0, 4)
        ),
        max_size=60,
    )
)
@example(  # the read's organization is forgotten by the time it stores
    [("read", 0), ("invalidate", 0), ("invalidate", 1), ("invalidate", 2), ("put", 0)]
)
def test_a_read_an_invalidation_overtook_never_stores_even_when_its_generation_is_forgotten(
    steps: list[Step],
) -> None:
    """With room for two organizations' generations and five organizations, generations are
    forgotten all the time: still no read that an invalidation of its organization (or a
    clear) overtook ever stores what it read."""
    cache = listening(max_generations=2)
    orgs = [uuid.UUID(int=i + 1) for i in range(5)]
    in_flight: list[tuple[int, Generation, bool]] = []  # org, generation, overtaken
    for number, (action, index) in enumerate(steps):
        if action == "read":
            in_flight.append((index, cache.generation(orgs[index]), False))
        elif action == "invalidate":
            cache.invalidate(orgs[index])
            in_flight = [(o, g, stale or o == index) for o, g, stale in in_flight]
        elif action == "clear":
            cache.clear()
            in_flight = [(o, g, True) for o, g, _ in in_flight]
        elif in_flight:
            org, generation, overtaken = in_flight.pop(index % len(in_flight))
            value = f"read {number}"
            cache.put(orgs[org], value, generation=generation)
            if overtaken:
                assert cache.get(orgs[org]) != value


def test_malformed_notifications_clear_the_cache_and_are_logged_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any login may NOTIFY: 5,000 calls of 8 KB each logged 41 MB, a line each with the whole
    payload (issue 32). Now one short line a minute counts them; each still clears the cache."""
    cache = listening()
    org = uuid.uuid4()
    invalidator = CacheInvalidator({"contextcore_dossier": cache}, "postgresql://unused")
    now = [0.0]
    invalidator.clock = lambda: now[0]
    with caplog.at_level(logging.WARNING, logger="contextcore.cache"):
        for i in range(5_000):
            cache.put(org, "entry", generation=cache.generation(org))
            invalidator._on_notify(None, 0, "contextcore_dossier", "x" * 7_990 + str(i))  # type: ignore[arg-type]
            assert cache.get(org) is None
        now[0] = 60.0
        invalidator._on_notify(None, 0, "contextcore_dossier", "last")  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, len(lines)
    assert all(len(line) < 200 for line in lines)
    assert ": 1 malformed" in lines[0], lines
    assert ": 5000 malformed" in lines[1], lines
