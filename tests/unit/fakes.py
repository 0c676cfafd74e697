"""Tiny in-process sources: fakes of the ContextSource *port*, for the pure builder/packer tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from schemas.context import (
    ContextItem,
    ContextKind,
    ContextRequest,
    ContextSourceSpec,
    ResourceRef,
)


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KnowledgeOptions(BaseModel):
    include_platform: bool = False
    include_organization: bool = False


class StaticSource:
    """Answers a fixed list, optionally after a delay; records every call."""

    options_schema: type[BaseModel] = NoOptions

    def __init__(
        self,
        name: str,
        items: Sequence[ContextItem] = (),
        *,
        delay: float = 0.0,
        error: Exception | None = None,
    ) -> None:
        self.name = name
        self.items = list(items)
        self.delay = delay
        self.error = error
        self.calls = 0
        self.started = asyncio.Event()
        self.cancelled = False

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        self.calls += 1
        self.started.set()
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        return list(self.items)


def item(
    source: str,
    kind: ContextKind = "application",
    title: str = "t",
    body: str = "b",
    *,
    key: str | None = None,
    ref: ResourceRef | None = None,
    body_refs: Sequence[ResourceRef] = (),
    tokens: int = 0,
    rank: int = 0,
) -> ContextItem:
    return ContextItem(
        source=source,
        kind=kind,
        title=title,
        body=body,
        subject_key=key,
        ref=ref,
        body_refs=list(body_refs),
        tokens=tokens,
        rank_in_section=rank,
    )
