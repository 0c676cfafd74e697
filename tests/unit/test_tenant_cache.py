"""The per-organization source cache: keyed by organization, bounded, and never storing a read
that an invalidation overtook."""

from __future__ import annotations

import uuid

import pytest

from contextcore.sources.cache import TenantCache


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
