"""Mixed load for the fault tests (chaos, a database restart): uniquely identified build
requests, memory writes and uploads, sent by a plain producer and each acknowledged by the
broker, and what the truth must be once they settle."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import asyncpg

from broker.topics import dead_letter_topic, ensure_topics, memory_topics, upload_topics
from schemas.memory import Invoker
from tests.integration.helpers import producer, remember_message, request_message
from tests.services import Config

ORG = uuid.UUID("7d000000-0000-4000-8000-0000000000c1")
DEFINITION = uuid.UUID("7d000000-0000-4000-8000-00000000d001")
USER = uuid.UUID("7d000000-0000-4000-8000-00000000e001")
PRINCIPAL = Invoker(organization_id=ORG, definition_id=DEFINITION, user_id=USER)
POISON = b"\xff poison, not JSON "


class Follows(Protocol):
    """What reads the load's topics (tests/integration/test_crash_loop.py's ``Reader``)."""

    async def follow(self, bootstrap: str, topic: str) -> None: ...


async def follow_load(config: Config, reader: Follows, name: str) -> tuple[str, list[str]]:
    """Make the topics a ``MixedLoad`` writes and ``reader`` follow its replies (on the reply
    topic ``name``) and the four dead-letter topics; those two, in that order."""
    await ensure_topics(
        config.bootstrap, [*memory_topics(config.topics), *upload_topics(config.topics)]
    )
    reply_to = config.reply_topic(name)
    await reader.follow(config.bootstrap, reply_to)
    topics = config.topics
    letters = [
        dead_letter_topic(topic)
        for topic in (topics.build_request, topics.memory_write, topics.upload, topics.embed)
    ]
    for topic in letters:
        await reader.follow(config.bootstrap, topic)
    return reply_to, letters


def upload(correlation_id: str, reply_to: str) -> dict[str, Any]:
    paragraphs = "\n\n".join(f"Paragraph {i} of {correlation_id}." for i in range(40))
    return {
        "correlation_id": correlation_id,
        "reply_to": reply_to,
        "scope": "organization",
        "organization_id": str(ORG),
        "title": f"Doc {correlation_id}",
        "media_type": "text/markdown",
        "idempotency_key": f"k-{correlation_id}",
        "uri": f"docs://load/{correlation_id}",
        "content": {"text": f"# Doc\n\n{paragraphs}"},
    }


class MixedLoad:
    """Every 0.1 s: ``per_tick`` builds and memory writes (over ``chains`` chains, each keyed by
    its chain); every ``upload_every`` ticks an upload; every ``poison_every`` ticks (0: never)
    one record that is not JSON on each request topic. What was sent, by kind."""

    def __init__(
        self,
        config: Config,
        reply_to: str,
        *,
        policy: dict[str, Any] | None = None,
        per_tick: int = 1,
        chains: int = 5,
        upload_every: int = 10,
        poison_every: int = 0,
    ) -> None:
        self.config = config
        self.reply_to = reply_to
        self.policy = policy
        self.per_tick = per_tick
        self.chains = chains
        self.upload_every = upload_every
        self.poison_every = poison_every
        self.builds: list[str] = []
        self.writes: list[str] = []
        self.uploads: list[str] = []
        self.poison: dict[str, int] = {}

    async def run(self, done: Callable[[], bool]) -> None:
        send = await producer(self.config.bootstrap)
        topics = self.config.topics
        tick = 0
        try:
            while not done():
                tick += 1
                for _ in range(self.per_tick):
                    cid = f"build-{len(self.builds)}"
                    message = request_message(cid, self.reply_to)
                    if self.policy is not None:
                        message["policy"] = self.policy
                        message["request"]["subject"]["organization_id"] = str(ORG)
                    await send.send_and_wait(
                        topics.build_request, json.dumps(message).encode(), key=cid.encode()
                    )
                    self.builds.append(cid)
                    cid = f"write-{len(self.writes)}"
                    chain = len(self.writes) % self.chains
                    await send.send_and_wait(
                        topics.memory_write,
                        json.dumps(
                            remember_message(
                                cid,
                                self.reply_to,
                                PRINCIPAL,
                                attribute=f"observation.load_{chain}",
                                text=f"revision {cid}",
                            )
                        ).encode(),
                        key=f"chain-{chain}".encode(),
                    )
                    self.writes.append(cid)
                if tick % self.upload_every == 0:
                    cid = f"upload-{len(self.uploads)}"
                    await send.send_and_wait(
                        topics.upload, json.dumps(upload(cid, self.reply_to)).encode()
                    )
                    self.uploads.append(cid)
                if self.poison_every and tick % self.poison_every == 0:
                    for topic in (topics.build_request, topics.memory_write, topics.upload):
                        await send.send_and_wait(topic, POISON + str(tick).encode())
                        self.poison[topic] = self.poison.get(topic, 0) + 1
                await asyncio.sleep(0.1)
        finally:
            await send.stop()

    def answered(self, replies: list[dict[str, Any]]) -> bool:
        """Every build and write answered, every upload ``ready``."""
        answered = {r["correlation_id"] for r in replies}
        ready = {r["correlation_id"] for r in replies if r.get("status") == "ready"}
        return set(self.builds) | set(self.writes) <= answered and set(self.uploads) <= ready

    def statuses(self, replies: list[dict[str, Any]], kind: list[str]) -> set[str]:
        """The statuses the requests of ``kind`` were answered with (duplicates included)."""
        sent = set(kind)
        return {r["status"] for r in replies if r["correlation_id"] in sent}

    async def assert_settled_truth(self, admin: asyncpg.Connection, replies: list[Any]) -> None:
        """What must hold once the load settled, from the replies and PostgreSQL: every build
        answered with a brief (a duplicate answer is at least once, allowed); every write
        answered ``written`` and stored once, one root and one head per chain; every upload
        ``ready``, its chunk count complete and each chunk stored once."""
        assert self.statuses(replies, self.builds) == {"ok"}
        assert self.statuses(replies, self.writes) == {"written"}
        revisions = await admin.fetchval(
            "SELECT count(*) FROM memories WHERE organization_id = $1", ORG
        )
        assert revisions == len(self.writes)
        chains = await admin.fetch(
            "SELECT subject_key, count(*) FILTER (WHERE supersedes_id IS NULL) AS roots"
            " FROM memories WHERE organization_id = $1 GROUP BY subject_key",
            ORG,
        )
        assert len(chains) == min(self.chains, len(self.writes))
        assert {r["roots"] for r in chains} == {1}  # one root each; 00009 refuses a fork
        heads = await admin.fetchval(
            "SELECT count(*) FROM memories m WHERE organization_id = $1 AND NOT EXISTS"
            " (SELECT 1 FROM memories c WHERE c.organization_id = m.organization_id"
            "  AND c.supersedes_id = m.id)",
            ORG,
        )
        assert heads == len(chains)  # one current head per chain
        sources = await admin.fetch(
            "SELECT s.uri, s.status, m.chunk_count, m.chunks_stored,"
            " (SELECT count(*) FROM knowledge_chunks c WHERE c.source_id = s.id) AS stored"
            " FROM knowledge_sources s JOIN knowledge_source_models m ON m.source_id = s.id"
        )
        uris = sorted(f"docs://load/{c}" for c in self.uploads)
        assert sorted(r["uri"] for r in sources) == uris
        assert {r["status"] for r in sources} <= {"ready"}
        assert all(r["chunk_count"] == r["chunks_stored"] == r["stored"] for r in sources)
        doubled = await admin.fetchval(
            "SELECT count(*) FROM (SELECT source_id, embedding_model, generation, ordinal"
            " FROM knowledge_chunks GROUP BY 1, 2, 3, 4 HAVING count(*) > 1) AS d"
        )
        assert doubled == 0
