"""``conversation``: the summary and the recent messages of ``request.conversation_id``.

A conversation that has a ``user_id`` belongs to that person: it is read only when the
subject's user is that user. One without a user belongs to the organization.

Newest message first (CLARIFICATIONS 1): a tight budget cuts the oldest messages, never the
newest reply. ``rank_in_section`` makes the kept messages render oldest to newest, after the
summary, which also spends first. Items carry no subject key: what the person said never wins
or loses a dedupe. No conversation in the request: no item. ``spec.limit`` caps the messages
(default 20); 0 reads nothing.

The order is total: ``(created_at DESC, id DESC)`` (migration 00029), so messages of one moment
are cut and rendered alike by every read of the same rows, whatever the plan.
"""

from __future__ import annotations

from pydantic import BaseModel

from contextcore.sources.common import NoOptions
from contextcore.storage.tenancy import ScopedRead, TenantDatabase
from schemas.context import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef

DEFAULT_MESSAGES = 20

RECENT = ScopedRead(
    "conversation.recent",
    "-- conversation.recent: the conversation if it is the subject's to read, with its newest\n"
    "-- messages, newest first (00029: one row per message; no row: not this subject's)\n"
    "SELECT summary, summary_updated_at, role, content, created_at\n"
    "FROM contextcore_read_conversation($1, $2, $3, $4)",
)


class ConversationContextSource:
    name = "conversation"
    options_schema: type[BaseModel] = NoOptions

    def __init__(self, database: TenantDatabase) -> None:
        self.database = database

    async def retrieve(self, request: ContextRequest, spec: ContextSourceSpec) -> list[ContextItem]:
        conversation_id = request.conversation_id
        if conversation_id is None or spec.limit == 0:
            return []
        limit = DEFAULT_MESSAGES if spec.limit is None else spec.limit
        subject = request.subject
        rows = await self.database.read(
            RECENT, subject.organization_id, conversation_id, subject.user_id, limit
        )
        if not rows:  # missing, another tenant's, or another person's
            return []
        conversation = rows[0]
        messages = [row for row in rows if row["role"] is not None]
        ref = ResourceRef(kind="conversation", id=str(conversation_id))
        items = []
        if conversation["summary"]:
            items.append(
                ContextItem(
                    source=self.name,
                    kind="conversation",
                    title="Summary so far",
                    body=conversation["summary"],
                    ref=ref,
                    recorded_at=conversation["summary_updated_at"],
                    rank_in_section=0,
                )
            )
        for index, message in enumerate(messages):  # newest first; the newest renders last
            items.append(
                ContextItem(
                    source=self.name,
                    kind="conversation",
                    title=message["role"].capitalize(),
                    body=message["content"],
                    recorded_at=message["created_at"],
                    rank_in_section=len(messages) - index,
                )
            )
        return items
