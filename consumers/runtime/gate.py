"""Who may run now: many records together, or one suspect alone.

A record that may have killed its process (:mod:`consumers.runtime.journal`) runs alone, so that
if the process dies again the culprit is known. :class:`SoloGate` is a readers-writer gate that
prefers the writer: once a suspect waits, no new record enters, the records inside finish, the
suspect runs, and the others follow. Suspects take their turns one at a time, in arrival order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SoloGate:
    def __init__(self) -> None:
        self._inside = 0
        self._solo_waiting = 0
        self._solo = asyncio.Lock()
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Run beside other shared holders, never beside a suspect."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._solo_waiting and not self._solo.locked())
            self._inside += 1
        try:
            yield
        finally:
            async with self._changed:
                self._inside -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Run with nothing else inside."""
        async with self._changed:
            self._solo_waiting += 1
        try:
            async with self._solo:
                async with self._changed:
                    await self._changed.wait_for(lambda: self._inside == 0)
                yield
        finally:
            async with self._changed:
                self._solo_waiting -= 1
                self._changed.notify_all()
