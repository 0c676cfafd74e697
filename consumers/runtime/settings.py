"""The knobs every consumer has. Each consumer subclasses :class:`ConsumerSettings` with its own
environment prefix (``CONTEXTCORE_BUILD_``, …), so two consumers on one host never share one."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsumerSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    group_id: str
    metrics_port: int = Field(ge=0, le=65535)
    """Port of ``/metrics``, ``/healthz`` and ``/readyz``; 0 turns the endpoint off."""
    max_in_flight: int = Field(default=64, ge=1, le=10_000)
    """Records handled at once by one process; more wait in lanes (``read_ahead``)."""
    quiet_slots: int = Field(default=4, ge=0, le=1_000)
    """Slots beyond ``max_in_flight`` that only a record of an organization with none running
    may take: with every slot busy with one tenant's flood, another tenant's first record
    starts at once, not after one of the flood's (issue 33). 0: none."""
    read_ahead: int = Field(default=1_000, ge=0, le=100_000)
    """Records received and not started yet, at most, besides the ``max_in_flight`` running:
    they wait in one lane per organization and a free slot takes the lanes in turn, so a
    tenant's record behind another's flood starts within a turn once it is read (docs/delivery.md,
    "Fair shares inside a consumer"). 0: the fetch waits for a free slot, first come first
    served."""
    read_ahead_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    """The waiting records' keys and values, at most (one record always gets in)."""
    handle_timeout_s: float = Field(default=30.0, gt=0)
    """A handler that takes longer is cancelled and its record retried."""
    stuck_after_s: float = Field(default=90.0, gt=0)
    """``/healthz`` fails while a record has been in flight longer than this (liveness), counted
    from its receipt (its wait in its lane included). It must exceed the longest a healthy
    record may take: its back-off, its handling and two publishes (checked when the app is
    built)."""
    commit_interval_s: float = Field(default=0.05, ge=0)
    """At most one offset commit per interval: positions that move meanwhile go in the next
    one. A crash replays at most this much finished work (at least once)."""
    drain_timeout_s: float = Field(default=20.0, gt=0)
    """On SIGTERM or a revoked partition: how long in-flight records may take to finish."""
    max_attempts: int = Field(default=4, ge=1, le=100)
    """A retriable failure is tried this many times in all, then dead-lettered."""
    retry_backoff_s: float = Field(default=0.2, gt=0)
    """Back-off before the second attempt; it doubles per attempt up to the maximum."""
    retry_backoff_max_s: float = Field(default=10.0, gt=0)
    fetch_max_wait_ms: int | None = Field(default=None, ge=0, le=10_000)
    """This consumer's own fetch wait, over ``CONTEXTCORE_KAFKA_FETCH_MAX_WAIT_MS``: a consumer
    whose records are not latency-bound (embedding batches) need not poll the dev broker 500
    times a second, which costs the CPU its work needs (docs/knowledge.md)."""
    max_crashes: int = Field(default=2, ge=1, le=100)
    """A record that took its process down this many times while it ran alone is dead-lettered
    (``crashed_the_consumer``) instead of started again (docs/delivery.md)."""
    unavailable_wait_max_s: float = Field(default=2.0, gt=0)
    """While the database does not answer, a record's handling is tried again in place, the
    wait doubling up to this; no attempt is spent."""
    nice: int = Field(default=0, ge=0, le=19)
    """How much lower this process's CPU priority is than it was started with (``os.nice``, at
    start, before any thread; the threads and worker processes it starts inherit it): on a
    shared node a batch consumer yields the cores to the build and memory consumers. 0: as
    started. The upload and embedding consumers default to 10 (docs/operations.md, "Fair
    shares")."""
    cpu_policy: Literal["normal", "idle"] = "normal"
    """``idle``: the process runs under Linux's ``SCHED_IDLE``, on the CPU time no process of
    normal priority wants; a build or memory consumer that wakes takes the core at once, where
    beside a nice-10 thread it may first wait for that thread's slice. Set at start with
    ``nice``, inherited the same way; elsewhere than Linux, ``nice`` alone. The price: on a
    node whose cores are busy all the time the process waits, with its records, until they are
    not. The upload and embedding consumers default to it (docs/operations.md, "Fair
    shares")."""
    dead_letter_payload_bytes: int = Field(default=64 * 1024, ge=256)
    """A dead letter keeps at most this much of the original record (with its size and sha256)."""

    @field_validator("group_id")
    @classmethod
    def _group_id(cls, group: str) -> str:
        """1 to 255 printable characters, no space at either end. An empty id is no group at
        all: the consumer commits nothing and reads its topic from the start each time it
        starts. The start journal keys its rows by the id, 255 characters at most
        (migration 00016)."""
        if not group:
            raise ValueError(
                "a consumer group id must not be empty: the consumer would join no group and "
                "read its topic again from the start"
            )
        if len(group) > 255 or not group.isprintable() or group.strip() != group:
            raise ValueError(
                "a consumer group id is 1 to 255 printable characters, no space at either end"
            )
        return group

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be at least retry_backoff_s")
        return self

    def longest_healthy_record_s(self, publish_timeout_s: float) -> float:
        """A record's worst healthy time in flight: its back-off wait, its handling, and a reply
        (or its fallback) that waits out the publish timeout twice."""
        return self.retry_backoff_max_s + self.handle_timeout_s + 2 * publish_timeout_s
