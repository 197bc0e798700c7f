"""Approximate mode with ``--router-approximate-cache-policy lru``: predicted blocks kept by capacity, not age.

Without KV events the router predicts each worker's cache from its own decisions (core/approximate.py keeps
a prediction for ``--router-ttl-secs``). An engine does not forget by the clock, though: it evicts its least
recently used blocks when its cache is full. This policy models that, as Dynamo's ``lru`` does: per worker,
the predicted blocks in recency order, bounded by the KV blocks the worker advertises (its card's
``total_kv_blocks``, learnt from the candidates each decision sees); recording a request renews its blocks,
and beyond the capacity the least recently used go. A worker that advertises no capacity is bounded by
``max_blocks`` alone (Dynamo's --router-max-tree-size, 2^20), like the ttl policy.

A request's blocks are renewed leaf first, so its root block is the most recent: eviction takes a prefix's
tail before its head, as an engine's LRU does (the head is shared by every later request of that prefix).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from services.router.core.index import RadixIndex


class LruApproximateCache:
    def __init__(self, index: RadixIndex, *, max_blocks: int = 1 << 20):
        self.index = index
        self.max_blocks = max_blocks
        self.capacity: dict[str, int] = {}  # worker -> its advertised KV blocks (0: unknown)
        self._lru: dict[str, collections.OrderedDict[int, None]] = {}  # worker -> seq hashes, oldest first

    def record(self, worker_id: str, seq_hashes: Sequence[int], local_hashes: Sequence[int]) -> None:
        """The worker will hold these prompt blocks once it has run the request."""
        self.index.store(worker_id, None, zip(seq_hashes, local_hashes, strict=True))
        blocks = self._lru.setdefault(worker_id, collections.OrderedDict())
        for h in reversed(seq_hashes):
            blocks[h] = None
            blocks.move_to_end(h)
        bound = self.capacity.get(worker_id, 0) or self.max_blocks
        while len(blocks) > bound:
            h, _ = blocks.popitem(last=False)
            self.index.remove(worker_id, (h,))

    def expire(self, now: float | None = None) -> int:
        """Nothing expires by age under lru (the ttl policy's hook)."""
        return 0

    def drop_worker(self, worker_id: str) -> None:
        self._lru.pop(worker_id, None)
        self.capacity.pop(worker_id, None)
        self.index.drop_worker(worker_id)

    def __len__(self) -> int:
        return sum(len(b) for b in self._lru.values())
