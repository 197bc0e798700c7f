"""A ``WorkerCall`` over a plain read function, for the fakes of the postprocessor's unit tests.

A task reads messages into a queue as they arrive; ``next_batch`` takes everything queued at once,
as the multiplexed worker call does with its own queue (services/common/mux_client.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from services.common.pump import Batch, take_batch

T = TypeVar("T")

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
