"""The builder: read every enabled source concurrently, time-boxed, then pack.

Invariants (``spec/context-layer.md``, "Source failure"):

* Every enabled source is scheduled before any result is awaited, so a blocked source never
  delays another's start. A disabled source is never resolved (no ``registry.get``) nor read.
* Each read has its own timeout (``source_timeout_s``, positive and finite).
* A source fails when it raises, times out, is missing from the registry, or returns an item
  that names another source (the packer would otherwise drop that item silently).
* Results are joined in policy order whatever order the reads finished in.
* Optional failures go to ``failed_sources`` (policy order) and the build goes on; all required
  failures are raised together in one :class:`RequiredContextSourceError`.
* Cancelling ``build`` cancels the reads still running and produces no brief: an outer
  cancellation is not a source failure.
* Observers (metrics) hear of every read with its duration and cause, and of the items the
  packer dropped; they never change the brief.
* :meth:`DefaultContextBuilder.build_explained` builds the same brief and its manifest
  (``schemas.context.BriefManifest``): every item with its outcome, every failed optional
  source with its cause, the policy's fingerprint and the text's sha256. It holds nothing
  measured, so the same request against the same rows gives the same bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode

from contextcore import tracing
from contextcore.packer import ContextPacker
from contextcore.registry import ContextSource, ContextSourceRegistry
from schemas.context import (
    BriefManifest,
    ContextBrief,
    ContextItem,
    ContextPolicy,
    ContextRequest,
    FailedRead,
    ReadFailure,
)
from schemas.context import ContextSourceSpec as Spec
from schemas.errors import ContextcoreError, RequiredContextSourceError

log = logging.getLogger("contextcore.builder")
_tracer = trace.get_tracer("contextcore.builder")
"""Each source read is a span (its outcome an attribute), and so is the packer: children of the
span current when :meth:`DefaultContextBuilder.build` is called (a consumer's record's)."""

__all__ = ["ContextBuilder", "DefaultContextBuilder", "RequiredContextSourceError"]


class ContextBuilder(Protocol):
    """What a consumer needs of a builder."""

    async def build(self, request: ContextRequest, policy: ContextPolicy) -> ContextBrief: ...

    async def build_explained(
        self, request: ContextRequest, policy: ContextPolicy
    ) -> tuple[ContextBrief, BriefManifest]:
        """The same brief as :meth:`build`, and its manifest (``explain: true``)."""
        ...


ReadCause = Literal["ok", "timeout", "error", "missing", "wrong_source"]
"""How one source read ended: items, its timeout, an exception, no such source in this process,
or an item that is not a ``ContextItem`` of that source."""


class SourceFailure(ContextcoreError):
    """Why one source produced no items (internal to the builder)."""

    def __init__(self, cause: ReadFailure, message: str) -> None:
        self.cause = cause
        super().__init__(message)


class BuildObserver(Protocol):
    """What a build tells its observer (metrics)."""

    def source_read(self, source: str, seconds: float, cause: ReadCause, required: bool) -> None:
        """One source read ended; a read that took its timeout took ``source_timeout_s``."""

    def items_dropped(self, drops: Mapping[tuple[str, str], int]) -> None:
        """Items the packer left out, by (source, reason); see :meth:`ContextPacker.pack`."""


class DefaultContextBuilder:
    def __init__(
        self,
        registry: ContextSourceRegistry,
        packer: ContextPacker,
        *,
        source_timeout_s: float = 1.0,
        observer: BuildObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Every failed read is logged with its reason (the brief only names the source);
        ``observer`` hears of every read and of every dropped item (metrics)."""
        if (
            isinstance(source_timeout_s, bool)
            or not isinstance(source_timeout_s, int | float)
            or not math.isfinite(source_timeout_s)
            or source_timeout_s <= 0
        ):
            raise ValueError(
                f"source_timeout_s must be a positive finite number, not {source_timeout_s!r}"
            )
        self.registry = registry
        self.packer = packer
        self.source_timeout_s = float(source_timeout_s)
        self.observer = observer
        self.clock = clock

    async def build(self, request: ContextRequest, policy: ContextPolicy) -> ContextBrief:
        items, failed = await self._read_all(request, policy)
        with tracing.span(_tracer, "pack"):
            return self.packer.pack(
                items,
                policy,
                failed_sources=[read.source for read in failed],
                on_drops=self._on_drops(),
            )

    async def build_explained(
        self, request: ContextRequest, policy: ContextPolicy
    ) -> tuple[ContextBrief, BriefManifest]:
        items, failed = await self._read_all(request, policy)
        with tracing.span(_tracer, "pack", attributes={"contextcore.explain": True}):
            brief, entries = self.packer.pack_explained(
                items,
                policy,
                failed_sources=[read.source for read in failed],
                on_drops=self._on_drops(),
            )
        manifest = BriefManifest(
            items=entries,
            failed_sources=failed,
            policy_sha256=policy_fingerprint(policy),
            brief_sha256=hashlib.sha256(brief.text.encode()).hexdigest(),
        )
        return brief, manifest

    def _on_drops(self) -> Callable[[Mapping[tuple[str, str], int]], None] | None:
        return None if self.observer is None else self._items_dropped

    async def _read_all(
        self, request: ContextRequest, policy: ContextPolicy
    ) -> tuple[list[ContextItem], list[FailedRead]]:
        """Every enabled source's items, joined in policy order, and the optional sources that
        failed (policy order); raises :class:`RequiredContextSourceError` naming every
        required one that failed."""
        enabled = [spec for spec in policy.sources if spec.enabled]
        reads = [  # scheduled now, all of them, before anything is awaited
            asyncio.ensure_future(self._read(self.registry.get(spec.name), request, spec))
            for spec in enabled
        ]
        try:
            results = await asyncio.gather(*reads, return_exceptions=True)
        except asyncio.CancelledError:
            for read in reads:
                read.cancel()
            raise
        items: list[ContextItem] = []
        failed: list[FailedRead] = []
        required: list[tuple[str, str]] = []
        for spec, result in zip(enabled, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result  # a read cancelled from outside the builder: no brief
            if isinstance(result, BaseException):
                _log_failure(spec.name, _reason(result), spec.required)
                if spec.required:
                    required.append((spec.name, _told(result)))
                else:
                    failed.append(self._failed_read(spec, result))
                continue
            items.extend(result)
        if required:
            raise RequiredContextSourceError([n for n, _ in required], [r for _, r in required])
        return items, failed

    def _failed_read(self, spec: Spec, error: BaseException) -> FailedRead:
        """What the manifest says of a failed read: no measured time (a rebuild gives the same
        bytes); a timeout names the configured time box."""
        if isinstance(error, SourceFailure):
            return FailedRead(source=spec.name, required=spec.required, cause=error.cause)
        if isinstance(error, TimeoutError):
            return FailedRead(
                source=spec.name,
                required=spec.required,
                cause="timeout",
                timeout_ms=round(self.source_timeout_s * 1000),
            )
        return FailedRead(
            source=spec.name, required=spec.required, cause="error", error=type(error).__name__
        )

    def _items_dropped(self, drops: Mapping[tuple[str, str], int]) -> None:
        assert self.observer is not None
        try:
            self.observer.items_dropped(drops)
        except Exception:  # an observer never changes a brief
            log.exception("the build observer failed on dropped items")

    async def _read(
        self, source: ContextSource | None, request: ContextRequest, spec: Spec
    ) -> list[ContextItem]:
        with tracing.span(
            _tracer,
            f"source {spec.name}",
            record_exception=False,
            set_status_on_exception=False,
        ) as current:
            return await self._timed_read(source, request, spec, current)

    async def _timed_read(
        self, source: ContextSource | None, request: ContextRequest, spec: Spec, span: Span
    ) -> list[ContextItem]:
        """The read, its outcome told to the observer and to its span."""
        started = self.clock()
        cause: ReadCause | None = "error"
        try:
            items = await self._checked_read(source, request, spec)
            cause = "ok"
            if span.is_recording():
                span.set_attribute("contextcore.items", len(items))
            return items
        except SourceFailure as failure:
            cause = failure.cause
            raise
        except TimeoutError:
            cause = "timeout"
            raise
        except asyncio.CancelledError:
            cause = None  # cancelled from outside: not a read that ended
            raise
        finally:
            if cause is not None and span.is_recording():
                span.set_attributes(
                    {"contextcore.source": spec.name, "contextcore.required": spec.required}
                )
                span.set_attribute("contextcore.outcome", cause)
                if cause != "ok":
                    span.set_status(StatusCode.ERROR, cause)
            if self.observer is not None and cause is not None:
                try:
                    seconds = self.clock() - started
                    self.observer.source_read(spec.name, seconds, cause, spec.required)
                except Exception:  # an observer never changes a read's result
                    log.exception("the build observer failed on a read of %s", spec.name)

    async def _checked_read(
        self, source: ContextSource | None, request: ContextRequest, spec: Spec
    ) -> list[ContextItem]:
        if source is None:
            raise SourceFailure(
                "missing", f"source {spec.name!r} is not registered in this process"
            )
        async with asyncio.timeout(self.source_timeout_s):
            items = await source.retrieve(request, spec)
        for item in items:
            if not isinstance(item, ContextItem):
                raise SourceFailure(
                    "wrong_source", f"returned {type(item).__name__}, not a ContextItem"
                )
            if item.source != spec.name:
                raise SourceFailure("wrong_source", f"returned an item of source {item.source!r}")
        return list(items)


def policy_fingerprint(policy: ContextPolicy) -> str:
    """sha256 of the policy as canonical JSON: sorted keys, no spaces, UTF-8."""
    canonical = json.dumps(
        policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _log_failure(name: str, reason: str, required: bool) -> None:
    log.warning(
        "%s context source %s failed: %s", "required" if required else "optional", name, reason
    )


def _reason(error: BaseException) -> str:
    """What the log says of a failed read: the whole error."""
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _told(error: BaseException) -> str:
    """What the caller is told of a failed required read: what the manifest says of one, the
    builder's own words or the error's class, never its text (a database's error names its
    tables, columns and values)."""
    if isinstance(error, SourceFailure):
        return str(error)
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"failed ({type(error).__name__})"
