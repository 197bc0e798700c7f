"""Takes whatever of a stream is ready at once, so that it can be merged.

Messages queue up as they arrive (a multiplexed call's queue, services/common/mux_client.py); the
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
    batch: Batch[T] = Batch([])
    for item in items:
        if item is end:
            batch.ended = True
        elif isinstance(item, BaseException):
            batch.error = item
        else:
            batch.messages.append(item)  # type: ignore[arg-type]
    return batch
