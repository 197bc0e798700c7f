"""Reads a per-request stream ahead of its consumer so that whatever is ready can be merged.

A task reads worker messages into a queue as they arrive; the consumer takes everything queued at
once (a multiplexed call, services/common/mux_client.py, has that queue already and needs no
task). When the consumer (the gateway, then Envoy, then the client) is slower than the engine, several
worker messages are waiting by the time it asks again, and they leave as one response instead of
one each: the per-message cost of gRPC, not the logic, dominates the mesh (design.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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


_END = object()


class StreamPump(Generic[T]):
    """Drives ``read`` in a background task until it returns None or raises.

    Args:
        read: returns the next message, or None at the end of the stream.
        cancel: aborts the stream (called by ``cancel``, also after the stream ended).
    """

    def __init__(self, read: Callable[[], Awaitable[T | None]], cancel: Callable[[], object]):
        self._read = read
        self._cancel = cancel
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        put = self._queue.put_nowait
        try:
            while (message := await self._read()) is not None:
                put(message)
            put(_END)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which decides what a failure means
            put(e)

    async def next_batch(self) -> Batch[T]:
        """Waits for at least one item, then takes every item already queued."""
        return await take_batch(self._queue, _END)

    def fail(self, error: BaseException) -> None:
        """Hands ``error`` to the consumer as the stream's failure (after what is already queued)."""
        self._queue.put_nowait(error)

    def cancel(self) -> None:
        """Cancels the stream and the reader; safe to call more than once and after the end."""
        self._cancel()
        self._task.cancel()


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
