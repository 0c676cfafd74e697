"""A real consumer whose handler kills its own process on a marked record, for the crash-loop
tests (issue 17): ``python -m tests.integration.crashing build|upload|embed|memory``.

Everything but the handler is the consumer as ``contextcore serve`` runs it. The handler is
wrapped: a record whose value holds :data:`KILL_MARK` ends the process with SIGKILL as soon as
its handling starts, before any outcome, as a parser that exhausts memory or crashes in native
code would. The test plays the supervisor (Kubernetes' restart policy) and restarts the process
each time it dies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from consumers.runtime.app import ConsumerApp
from consumers.runtime.metrics import RuntimeMetrics
from consumers.runtime.records import Inbound, Outcome, Reply, Stopwatch
from consumers.runtime.transport import Publisher, RecordHandler

KILL_MARK = b"kill-the-consumer"


class Killing:
    def __init__(self, handler: RecordHandler) -> None:
        self.handler = handler

    async def handle(self, record: Inbound, watch: Stopwatch) -> Outcome:
        if KILL_MARK in (record.value or b""):
            print(f"killing myself on {record.position}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return await self.handler.handle(record, watch)

    def farewell(self, record: Inbound, reason: str) -> Reply | None:
        return self.handler.farewell(record, reason)


def create(consumer: str) -> ConsumerApp:
    if consumer == "build":
        from consumers.build.app import create_app as build

        return build()
    if consumer == "upload":
        from consumers.knowledge.upload.app import create_app as upload

        return upload()
    if consumer == "embed":
        from consumers.knowledge.embed.app import create_app as embed

        return embed()
    from consumers.memory.app import create_app as memory

    return memory()


def main(consumer: str) -> None:
    app = create(consumer)
    opened = app.open_handler

    @asynccontextmanager
    async def open_killing(
        metrics: RuntimeMetrics, publisher: Publisher
    ) -> AsyncIterator[RecordHandler]:
        async with opened(metrics, publisher) as handler:
            yield Killing(handler)

    app.open_handler = open_killing
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(app.run())


if __name__ == "__main__":
    main(sys.argv[1])
