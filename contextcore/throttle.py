"""Per-organization rate limits: one tenant's flood of requests is answered ``throttled`` at
once, cheaply, instead of taking every slot of a consumer another tenant needs (issue 33;
docs/operations.md, "Fair shares").

A token bucket per organization: ``rate`` tokens a second, at most ``burst`` saved up (each
organization's own, its quotas: contextcore/quotas.py); a request takes one token, and a request
that finds none is refused with the time until one is there (it takes nothing, so a caller that
waits that long is admitted). Pure logic, one process's view: with N consumer processes sharing
a topic whose records are spread over partitions at random, an organization gets about N times
``rate``.

Memory is bounded: at most ``max_organizations`` buckets, the least recently used forgotten
first. A forgotten bucket is full again when its organization comes back, so the bound only
loosens the limit of an organization idle for longer than ``max_organizations`` others' turns.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from uuid import UUID


class OrganizationRate:
    """``admit(organization, rate, burst)``: 0 when admitted, otherwise the seconds until it
    would be."""

    def __init__(
        self, *, max_organizations: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_organizations < 1:
            raise ValueError("at least one bucket")
        self.max_organizations = max_organizations
        self.clock = clock
        self._buckets: OrderedDict[UUID, tuple[float, float]] = OrderedDict()
        """organization → (tokens, when they were counted)"""

    def admit(self, organization: UUID, rate: float, burst: float) -> float:
        """Take a token of ``organization``'s bucket, which refills at ``rate`` a second up to
        ``burst`` (a changed quota applies from this call on)."""
        if rate <= 0 or burst < 1:
            raise ValueError("a rate above 0 and a burst of at least 1")
        now = self.clock()
        tokens, counted = self._buckets.pop(organization, (burst, now))
        tokens = min(burst, tokens + max(0.0, now - counted) * rate)
        wait_s = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait_s = (1 - tokens) / rate
        self._buckets[organization] = (tokens, now)  # the most recently used, last
        while len(self._buckets) > self.max_organizations:
            self._buckets.popitem(last=False)
        return wait_s

    def __len__(self) -> int:
        return len(self._buckets)


class BoundedLabels:
    """A label value per organization for the first ``limit`` organizations a counter sees,
    ``other`` for the rest: per-organization series whose number stays bounded."""

    OTHER = "other"

    def __init__(self, limit: int = 50) -> None:
        self.limit = limit
        self._named: set[UUID] = set()

    def __call__(self, organization: UUID) -> str:
        if organization in self._named:
            return str(organization)
        if len(self._named) < self.limit:
            self._named.add(organization)
            return str(organization)
        return self.OTHER
