"""The database's side of the per-organization caches (:mod:`contextcore.cache`): LISTEN on
each cache's channel and invalidate the organization a notification names.

A write to a cached table fires ``pg_notify(<channel>, <organization id>)`` (the dossier's
tables: migration 00003; definitions: 00030), or an empty payload when a platform row changed.
While the listener is down nothing is cached at all: a missed notification would serve stale
rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

import asyncpg

from contextcore.cache import TenantCache

log = logging.getLogger("contextcore.cache")

MALFORMED_LOG_INTERVAL_S = 60.0


class CacheInvalidator:
    """LISTENs on each cache's channel on its own connection and invalidates that cache.

    A lost connection turns caching off at once and reconnects in the background (back-off from
    ``reconnect_delay_s`` to 30 s); caching resumes once the LISTEN is back, never before.
    """

    def __init__(
        self,
        caches: Mapping[str, TenantCache[Any]],
        database_url: str,
        *,
        reconnect_delay_s: float = 0.5,
    ) -> None:
        self.caches = dict(caches)
        self.database_url = database_url
        self.reconnect_delay_s = reconnect_delay_s
        self._conn: asyncpg.Connection | None = None
        self._reconnect: asyncio.Task[None] | None = None
        self._stopped = False
        self._malformed = 0
        """Malformed notifications not logged yet: any login may NOTIFY, 8 KB a call, and
        5,000 calls grew a consumer's log by 41 MB (issue 32); one line a minute says them."""
        self._malformed_logged_at = float("-inf")
        self.clock: Callable[[], float] = time.monotonic

    async def start(self) -> None:
        self._stopped = False
        await self._connect()

    async def stop(self) -> None:
        self._stopped = True
        self._listening(False)
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
            self._reconnect = None
        if self._conn is not None:
            self._conn.remove_termination_listener(self._on_termination)  # a chosen close
            await self._conn.close()
            self._conn = None

    def _listening(self, on: bool) -> None:
        for cache in self.caches.values():
            cache.listening = on
            if not on:
                cache.clear()

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.database_url)
        conn.add_termination_listener(self._on_termination)
        for channel in self.caches:
            await conn.add_listener(channel, self._on_notify)
        self._conn = conn
        self._listening(True)

    async def _reconnect_until_listening(self) -> None:
        delay = self.reconnect_delay_s
        while not self._stopped:
            try:
                await self._connect()
            except (TimeoutError, OSError, asyncpg.PostgresError) as error:
                log.warning(
                    "cache listener: reconnect failed (%s); retrying in %.1f s", error, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                log.warning("cache listener reconnected: caching is back on")
                return

    def _on_notify(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        pid: int,
        channel: str,
        payload: object,
    ) -> None:
        cache = self.caches.get(channel)
        if cache is None:
            return
        if payload in ("", None):  # a platform row: every organization's entry may hold it
            cache.clear()
            return
        try:
            cache.invalidate(UUID(str(payload)))
        except ValueError:
            cache.clear()
            self._malformed += 1
            now = self.clock()
            if now - self._malformed_logged_at >= MALFORMED_LOG_INTERVAL_S:
                log.warning(
                    "%s: %d malformed notification(s), the last %.64r; each dropped every entry",
                    channel,
                    self._malformed,
                    str(payload),
                )
                self._malformed, self._malformed_logged_at = 0, now

    def _on_termination(self, conn: object) -> None:
        log.warning("cache listener connection lost: caching is off until it reconnects")
        self._listening(False)
        self._conn = None
        if not self._stopped and (self._reconnect is None or self._reconnect.done()):
            self._reconnect = asyncio.get_running_loop().create_task(
                self._reconnect_until_listening()
            )
