"""Takes whatever of a stream is ready at once, so that it can be merged.

Messages queue up as they arrive (a multiplexed call's ``Inbox``, services/common/mux_client.py); the
consumer takes everything queued at once. When the consumer (the gateway, then Envoy, then the
client) is slower than the engine, several messages are waiting by the time it asks again, and they
leave as one response instead of one each: the per-message cost of gRPC, not the logic, dominates the
mesh (design.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Batch(Generic[T]):
    """Messages that were ready together, and how the stream ended if it did.

    Attributes:
        messages: worker messages in arrival order (may be empty when the stream just ended).
        ended: the stream ended cleanly after these messages.
        error: the stream failed after these messages.
    """

    messages: list[T]
    ended: bool = False
    error: BaseException | None = None


async def take_batch(queue: asyncio.Queue[object], end: object) -> Batch[T]:
    """Waits for one item of ``queue``, then takes every item already there: messages, ``end`` or an error."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    return batch_of(items, end)


def batch_of(items: list[object], end: object) -> Batch[T]:
    """``items`` (messages, ``end``, errors, in arrival order) as a Batch. Nearly every batch is messages
    alone: the list becomes the batch's as it is."""
    for item in items:
        if item is end or isinstance(item, BaseException):
            break
    else:
        return Batch(items)  # type: ignore[arg-type]
    batch: Batch[T] = Batch([])
    for item in items:
        if item is end:
            batch.ended = True
        elif isinstance(item, BaseException):
            batch.error = item
        else:
            batch.messages.append(item)  # type: ignore[arg-type]
    return batch


class Inbox:
    """One consumer's queue that hands over everything queued at once (``take``): a list and a waiter.

    ``asyncio.Queue`` does this in Python too, with more steps per item (its size bound, its getter deque,
    ``task_done`` bookkeeping, one ``get_nowait`` per item taken); a multiplexed call puts one item per
    engine step per request, so on a paced engine that cost is per token (services/common/mux_client.py).
    """

    __slots__ = ("_end", "_items", "_waiter")

    def __init__(self, end: object):
        self._end = end
        self._items: list[object] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: object) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # a consumer cancelled in ``take`` left its waiter cancelled
                waiter.set_result(None)

    async def take(self) -> Batch[T]:
        """Waits for one item, then takes every item there: messages, the end (``end``) or an error."""
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return batch_of(items, self._end)
