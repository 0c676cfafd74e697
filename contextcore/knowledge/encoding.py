"""The encoder port, and what every encoder is shared through: the domain embeds with an
:class:`Encoder` and never imports a model library; the adapters (torch and sentence-transformers,
OpenVINO) live in encoder.py and load in a worker thread."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Protocol


class Encoder(Protocol):
    model: str
    """The pinned model name every chunk it embeds is stored under."""
    dimensions: int

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order. Blocking: call it from a worker thread."""
        ...


_Call = tuple[list[str], "asyncio.Future[list[list[float]]]"]


class SharedEncoder:
    """The process's one encoder, loaded on first use in a worker thread (loading takes
    seconds, an OpenVINO export longer): every caller awaits the same load."""

    def __init__(self, load: Callable[[], Encoder]) -> None:
        self._load = load
        self._encoder: Encoder | None = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> Encoder:
        if self._encoder is None:
            async with self._lock:
                if self._encoder is None:
                    self._encoder = await asyncio.to_thread(self._load)
        return self._encoder


class CoalescingEncoder:
    """One encoder shared by concurrent batches: the calls that arrive while an encode runs are
    merged into the next one (up to ``max_texts``), so a document's short last batch rides with
    another's instead of paying a model call of its own. Results go back to each caller in its
    own order; a failed encode fails every caller merged into it.

    The waiting calls queue by ``lane`` (the embedding group's: the organization), and the next
    encode takes the lanes in turn: a tenant's batch behind another's flood rides the next
    encode, not the one after the flood (issue 33). One lane's calls keep their order.

    A light lane (at most a quarter of an encode waiting, and at most a quarter of the heaviest
    lane's texts) beside a heavier one goes first, in an encode of the light lanes alone: an
    encode's time grows with its texts, so a tenant's one passage is not held for a full encode
    of another's flood (beside 5,000 documents, that was a second more for every small upload).
    Relative, not only absolute: a flood's lane holds only its batches in flight (16 slots of
    one or two passages), often under a quarter of an encode, and a small upload beside it
    still rode a merged encode (about 900 ms on a busy 2-core node; an encode of its own
    passages takes a tenth of that). At most every other encode is light: the heavy lanes get
    at least half of the encodes whatever the light traffic."""

    def __init__(self, encoder: Encoder, max_texts: int = 64) -> None:
        self.encoder = encoder
        self.model = encoder.model
        self.max_texts = max_texts
        self.light_texts = max(1, max_texts // 4)
        self._waiting: OrderedDict[object, deque[_Call]] = OrderedDict()
        self._worker: asyncio.Task[None] | None = None
        self._last_was_light = False

    async def encode(self, texts: Sequence[str], lane: object = None) -> list[list[float]]:
        future: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(lane)
        if queue is None:
            queue = self._waiting[lane] = deque()
        queue.append((list(texts), future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    def _next_encode(self) -> list[_Call]:
        """The calls of the next encode: the head of each lane in turn, while they fit; only
        the light lanes' when some are light and some heavy (not twice in a row)."""
        lanes = list(self._waiting)
        if not self._last_was_light and len(lanes) > 1:
            waiting = {lane: self._texts_waiting(lane) for lane in lanes}
            limit = min(self.light_texts, max(waiting.values()) // 4)
            light = [lane for lane in lanes if waiting[lane] <= limit]
            if light and len(light) < len(lanes):
                lanes = light
        self._last_was_light = len(lanes) < len(self._waiting)
        taken: list[_Call] = []
        count = 0
        while lanes:
            lane = lanes[0]
            queue = self._waiting[lane]
            texts, future = queue[0]
            if taken and count + len(texts) > self.max_texts:
                break
            queue.popleft()
            lanes.pop(0)
            if queue:
                self._waiting.move_to_end(lane)
                lanes.append(lane)
            else:
                del self._waiting[lane]
            if future.done():  # its caller was cancelled while it waited
                continue
            taken.append((texts, future))
            count += len(texts)
        return taken

    def _texts_waiting(self, lane: object) -> int:
        return sum(len(texts) for texts, _ in self._waiting[lane])

    async def _drain(self) -> None:
        while self._waiting:
            taken = self._next_encode()
            if not taken:
                continue
            merged = [text for texts, _ in taken for text in texts]
            try:
                vectors = await asyncio.to_thread(self.encoder.encode, merged)
            except Exception as error:
                for _, future in taken:
                    if not future.done():
                        future.set_exception(error)
                continue
            start = 0
            for texts, future in taken:
                if not future.done():
                    future.set_result(vectors[start : start + len(texts)])
                start += len(texts)
