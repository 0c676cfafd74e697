"""``conversation``: the summary and the recent messages of ``request.conversation_id``.

A conversation that has a ``user_id`` belongs to that person: it is read only when the
subject's user is that user. One without a user belongs to the organization.

Newest message first (CLARIFICATIONS 1): a tight budget cuts the oldest messages, never the
newest reply. ``rank_in_section`` makes the kept messages render oldest to newest, after the
summary, which also spends first. Items carry no subject key: what the person said never wins
or loses a dedupe. No conversation in the request: no item. ``spec.limit`` caps the messages
(default 20); 0 reads nothing.
"""

from __future__ import annotations

from pydantic import BaseModel

from contextcore.models import ContextItem, ContextRequest, ContextSourceSpec, ResourceRef
from contextcore.sources.common import NoOptions
from contextcore.storage.tenancy import TenantDatabase, TenantQuery

DEFAULT_MESSAGES = 20

RECENT = TenantQuery(
    "conversation.recent",
    """
-- conversation.recent: the conversation of this tenant, if it exists and is the subject's to
-- read (the organization's: no user; or this user's own), with its newest messages, newest
-- first, bounded by $4. One row per message; a conversation without messages gives one row
-- whose message columns are null; no row at all: missing, another tenant's or another
-- person's conversation.
SELECT c.summary, c.summary_updated_at, m.role, m.content, m.created_at
FROM conversations AS c
LEFT JOIN LATERAL (
    SELECT role, content, created_at, id FROM conversation_messages
    WHERE organization_id = $1 AND conversation_id = c.id
    ORDER BY created_at DESC, id DESC
    LIMIT $4
) AS m ON true
WHERE c.organization_id = $1 AND c.id = $2 AND (c.user_id IS NULL OR c.user_id = $3)
ORDER BY m.created_at DESC, m.id DESC
""",
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
        async with self.database.scoped(request.subject.organization_id) as tenant:
            rows = await tenant.fetch(RECENT, conversation_id, request.subject.user_id, limit)
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
