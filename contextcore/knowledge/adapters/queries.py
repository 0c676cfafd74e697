"""A query's vector under a model, as the text pgvector reads, for the knowledge source.

* **Coalesced.** The encodes of the builds in flight go to one :class:`CoalescingEncoder` per
  model: questions that arrive while the model runs are embedded together in its next call.
* **Cached.** The last ``max_entries`` vectors are kept, keyed by organization, model and text:
  an agent that asks the same question again (a retry, a resumed turn, a second agent on the
  same page) costs no encode. A vector is a function of the text and the model, never stale;
  the organization in the key keeps one tenant's questions from answering, or timing, another's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from uuid import UUID

from contextcore.knowledge.adapters.store import vector_text
from contextcore.knowledge.encoding import CoalescingEncoder, Encoder


class QueryVectors:
    name = "query_vectors"

    def __init__(
        self,
        encoders: Callable[[str], Awaitable[Encoder]],
        *,
        max_entries: int = 1_000,
        max_texts: int = 32,
    ) -> None:
        """``encoders`` gives the process's encoder of a model (``KeyError``: not one it
        knows); ``max_texts`` caps the questions of one coalesced encode."""
        self._encoders = encoders
        self.max_entries = max_entries
        self.max_texts = max_texts
        self.hits = 0
        self.misses = 0
        self._coalescing: dict[str, CoalescingEncoder] = {}
        self._vectors: OrderedDict[tuple[UUID, str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._vectors)

    async def vector(self, organization_id: UUID, model: str, text: str) -> str:
        """Raises ``KeyError`` for a model this process does not know, and what the encoder
        raises."""
        key = (organization_id, model, text)
        cached = self._vectors.get(key)
        if cached is not None:
            self.hits += 1
            self._vectors.move_to_end(key)
            return cached
        self.misses += 1
        coalescing = self._coalescing.get(model)
        if coalescing is None:
            encoder = await self._encoders(model)
            coalescing = self._coalescing.setdefault(
                model, CoalescingEncoder(encoder, max_texts=self.max_texts)
            )
        [vector] = await coalescing.encode([text])
        found = vector_text(vector)
        if self.max_entries > 0:
            self._vectors[key] = found
            while len(self._vectors) > self.max_entries:
                self._vectors.popitem(last=False)
        return found
