"""The per-organization build rate (contextcore/throttle.py): a token bucket per organization,
its rate and burst the organization's quotas, on a clock the test moves."""

from __future__ import annotations

import uuid

import pytest

from contextcore.throttle import BoundedLabels, OrganizationRate

A = uuid.UUID("7c000000-0000-4000-8000-0000000000a1")
B = uuid.UUID("7c000000-0000-4000-8000-0000000000b1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_organization_gets_its_burst_then_its_rate_and_hears_how_long_to_wait() -> None:
    clock = Clock()
    rate = OrganizationRate(clock=clock)
    assert [rate.admit(A, 2.0, 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.admit(A, 2.0, 3) == pytest.approx(0.5)  # one token at 2 a second
    clock.now += 0.25
    assert rate.admit(A, 2.0, 3) == pytest.approx(0.25)  # a refusal took nothing: half a token
    clock.now += 0.25
    assert rate.admit(A, 2.0, 3) == 0.0
    assert rate.admit(A, 2.0, 3) == pytest.approx(0.5)


def test_one_organizations_flood_leaves_anothers_bucket_whole() -> None:
    clock = Clock()
    rate = OrganizationRate(clock=clock)
    refused = sum(1 for _ in range(100) if rate.admit(A, 1.0, 2))
    assert refused == 98
    assert [rate.admit(B, 1.0, 2), rate.admit(B, 1.0, 2)] == [0.0, 0.0]


def test_a_changed_quota_applies_from_the_next_request() -> None:
    clock = Clock()
    rate = OrganizationRate(clock=clock)
    assert [rate.admit(A, 1.0, 1) > 0 for _ in range(2)] == [False, True]
    clock.now += 0.1
    assert rate.admit(A, 100.0, 1) == 0.0  # 0.1 s at the raised rate refilled the bucket


def test_a_bucket_never_saves_more_than_the_burst() -> None:
    clock = Clock()
    rate = OrganizationRate(clock=clock)
    rate.admit(A, 10.0, 2)
    clock.now += 3600
    assert [rate.admit(A, 10.0, 2) > 0 for _ in range(3)] == [False, False, True]


def test_the_buckets_are_bounded_least_recently_used_first() -> None:
    clock = Clock()
    rate = OrganizationRate(max_organizations=3, clock=clock)
    for _ in range(10):
        rate.admit(uuid.uuid4(), 1.0, 1)
    assert len(rate) == 3
    rate.admit(A, 1.0, 1)
    assert rate.admit(A, 1.0, 1) > 0  # A is the most recent: kept, and empty
    for _ in range(2):
        rate.admit(uuid.uuid4(), 1.0, 1)
    assert rate.admit(A, 1.0, 1) > 0  # still among the three most recent


def test_a_rate_must_let_something_through() -> None:
    buckets = OrganizationRate()
    for rate, burst in ((0.0, 1), (1.0, 0.5), (-1.0, 1)):
        with pytest.raises(ValueError, match="a rate above 0"):
            buckets.admit(A, rate, burst)


def test_labels_name_the_first_organizations_and_lump_the_rest() -> None:
    labels = BoundedLabels(limit=2)
    first, second = uuid.uuid4(), uuid.uuid4()
    assert [labels(first), labels(second), labels(uuid.uuid4())] == [
        str(first),
        str(second),
        BoundedLabels.OTHER,
    ]
    assert labels(first) == str(first)
