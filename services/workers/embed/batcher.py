"""Gathers the inputs of concurrent Embed calls into batches, one forward pass each.

One task runs batches back to back. Each batch takes the inputs queued when the previous one
ended, oldest first, up to ``max_batch_size`` inputs and ``max_batch_tokens`` padded tokens (a batch
is padded to its longest input). Under load the queue fills while the model runs, so batches grow
with concurrency; a lone request waits for nothing: no timer holds a batch open.

The forward pass runs on a thread (torch releases the GIL), so the event loop keeps accepting and
queueing requests meanwhile. A request's inputs may span batches; its future resolves when its last
input is done. A caller that goes away (cancelled future) has its queued inputs skipped.

Pure asyncio and numpy: the model is the ``run`` callable handed in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)

RunBatch = Callable[[list[Sequence[int]]], np.ndarray]


@dataclasses.dataclass(eq=False)
class _Job:
    """One caller's inputs; ``rows`` fill in as their batches finish."""

    future: asyncio.Future[np.ndarray]
    rows: list[np.ndarray | None]
    remaining: int

    def deliver(self, index: int, row: np.ndarray) -> None:
        self.rows[index] = row
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(np.stack(self.rows))  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=False)
class _Item:
    job: _Job
    index: int
    token_ids: Sequence[int]


def take_batch(queue: collections.deque[_Item], max_batch_size: int, max_batch_tokens: int) -> list[_Item]:
    """Pops the longest prefix of ``queue`` that fits both limits (at least one item, if any)."""
    batch: list[_Item] = []
    longest = 0
    while queue and len(batch) < max_batch_size:
        item = queue[0]
        if item.job.future.done():  # its caller went away, or another input of it failed
            queue.popleft()
            continue
        padded = (len(batch) + 1) * max(longest, len(item.token_ids))
        if batch and padded > max_batch_tokens:
            break
        batch.append(queue.popleft())
        longest = max(longest, len(item.token_ids))
    return batch


class EmbedBatcher:
    """``await embed(inputs)`` -> float32 array ``[len(inputs), dimensions]``."""

    def __init__(self, run: RunBatch, *, max_batch_size: int = 32, max_batch_tokens: int = 8192,
                 observe: Callable[[int], None] | None = None):
        if max_batch_size < 1 or max_batch_tokens < 1:
            raise ValueError("max_batch_size and max_batch_tokens must be positive")
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self._queue: collections.deque[_Item] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Sizes of the batches run so far (the service test and the benchmark read how well it batched).
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        self._observe = observe  # each batch's size, for a metric

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="embed-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for item in self._queue:
            if not item.job.future.done():
                item.job.future.set_exception(RuntimeError("the embedding worker is shutting down"))
        self._queue.clear()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        if not inputs:
            raise ValueError("nothing to embed")
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        job = _Job(asyncio.get_running_loop().create_future(), [None] * len(inputs), len(inputs))
        self._queue.extend(_Item(job, i, ids) for i, ids in enumerate(inputs))
        self._wake.set()
        return await job.future  # cancelling this cancels the future: its queued inputs are skipped

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := take_batch(self._queue, self.max_batch_size, self.max_batch_tokens):
                await self._run_one(batch)

    async def _run_one(self, batch: list[_Item]) -> None:
        self.batch_sizes[len(batch)] += 1
        if self._observe is not None:
            self._observe(len(batch))
        try:
            out = await asyncio.to_thread(self._run, [item.token_ids for item in batch])
        except Exception as e:
            log.exception("embedding a batch of %d inputs failed", len(batch))
            for item in batch:
                if not item.job.future.done():
                    item.job.future.set_exception(e)
            return
        for row, item in zip(out, batch, strict=True):
            if not item.job.future.done():
                item.job.deliver(item.index, row)
