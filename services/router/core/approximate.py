"""Approximate mode: predict workers' caches from the router's own decisions, with expiry.

For engines that publish no KV events. After each routing decision the request's prompt blocks are
recorded for the chosen worker with a time to live; a block routed again has its life renewed.
Expired blocks leave the index, and when the prediction grows past ``max_blocks`` the oldest go
first down to ``prune_ratio`` of it (Dynamo: ``--router-ttl-secs`` 120, ``--router-max-tree-size``
2^20, ``--router-prune-target-ratio`` 0.8).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from services.router.core.index import RadixIndex


class ApproximateCache:
    def __init__(self, index: RadixIndex, *, ttl_s: float = 120.0, max_blocks: int = 1 << 20,
                 prune_ratio: float = 0.8, clock: Callable[[], float] = time.monotonic):
        self.index = index
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self.prune_ratio = prune_ratio
        self._clock = clock
        # (worker, block hash) -> expiry; the queue holds (expiry, worker, hash) in time order and may
        # hold stale entries for renewed blocks, recognised by a differing expiry.
        self._expiry: dict[tuple[str, int], float] = {}
        self._queue: collections.deque[tuple[float, str, int]] = collections.deque()

    def record(self, worker_id: str, seq_hashes: Sequence[int], local_hashes: Sequence[int]) -> None:
        """The worker will hold these prompt blocks once it has run the request."""
        now = self._clock()
        self.expire(now)
        expires = now + self.ttl_s
        self.index.store(worker_id, None, zip(seq_hashes, local_hashes, strict=True))
        for h in seq_hashes:
            self._expiry[(worker_id, h)] = expires
            self._queue.append((expires, worker_id, h))
        if len(self._expiry) > self.max_blocks:
            self._prune_to(int(self.max_blocks * self.prune_ratio))

    def expire(self, now: float | None = None) -> int:
        now = self._clock() if now is None else now
        removed = 0
        while self._queue and self._queue[0][0] <= now:
            removed += self._pop_oldest()
        return removed

    def _prune_to(self, target: int) -> None:
        while len(self._expiry) > target and self._queue:
            self._pop_oldest()

    def _pop_oldest(self) -> int:
        expires, worker_id, h = self._queue.popleft()
        if self._expiry.get((worker_id, h)) != expires:
            return 0  # renewed since; a later queue entry stands for it
        del self._expiry[(worker_id, h)]
        self.index.remove(worker_id, (h,))
        return 1

    def drop_worker(self, worker_id: str) -> None:
        for key in [k for k in self._expiry if k[0] == worker_id]:
            del self._expiry[key]
        self.index.drop_worker(worker_id)

    def __len__(self) -> int:
        return len(self._expiry)
