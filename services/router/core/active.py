"""The load this router (and its replicas) put on each worker, in KV blocks, until it ends.

Per request: the blocks of its prompt (sequence hashes, so blocks shared by requests on the same
worker count once, as they do in a paged cache) and the prefill blocks it still has to compute,
which stop counting when its first token arrives. Per worker the totals are kept incrementally, so
a routing decision reads them in O(1) plus one prefix walk for the dedup.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass
class _Active:
    worker_id: str
    seq_hashes: tuple[int, ...]
    prefill_blocks: int  # still to compute; 0 once prefilled


@dataclasses.dataclass(frozen=True)
class WorkerLoad:
    in_flight: int = 0
    active_blocks: int = 0
    prefill_blocks: int = 0


class ActiveRequests:
    def __init__(self) -> None:
        self._requests: dict[str, _Active] = {}
        self._blocks: dict[str, collections.Counter[int]] = {}
        self._prefill: collections.Counter[str] = collections.Counter()
        self._in_flight: collections.Counter[str] = collections.Counter()

    def add(self, request_id: str, worker_id: str, seq_hashes: Sequence[int], prefill_blocks: int) -> None:
        self.free(request_id)
        self._requests[request_id] = _Active(worker_id, tuple(seq_hashes), prefill_blocks)
        self._blocks.setdefault(worker_id, collections.Counter()).update(seq_hashes)
        self._prefill[worker_id] += prefill_blocks
        self._in_flight[worker_id] += 1

    def mark_prefilled(self, request_id: str) -> bool:
        active = self._requests.get(request_id)
        if active is None or not active.prefill_blocks:
            return False
        self._prefill[active.worker_id] -= active.prefill_blocks
        active.prefill_blocks = 0
        return True

    def free(self, request_id: str) -> bool:
        active = self._requests.pop(request_id, None)
        if active is None:
            return False
        w = active.worker_id
        self._prefill[w] -= active.prefill_blocks
        self._in_flight[w] -= 1
        blocks = self._blocks[w]
        blocks.subtract(active.seq_hashes)
        for h in active.seq_hashes:
            if blocks.get(h, 1) <= 0:
                del blocks[h]
        if self._in_flight[w] <= 0:
            self._forget(w)
        return True

    def _forget(self, worker_id: str) -> None:
        self._blocks.pop(worker_id, None)
        self._prefill.pop(worker_id, None)
        self._in_flight.pop(worker_id, None)

    def drop_worker(self, worker_id: str) -> None:
        for rid in [r for r, a in self._requests.items() if a.worker_id == worker_id]:
            del self._requests[rid]
        self._forget(worker_id)

    def load(self, worker_id: str) -> WorkerLoad:
        return WorkerLoad(self._in_flight.get(worker_id, 0), len(self._blocks.get(worker_id, ())),
                          self._prefill.get(worker_id, 0))

    def workers(self) -> list[str]:
        """Workers running at least one request."""
        return list(self._blocks)

    def shared_prefix(self, worker_id: str, seq_hashes: Sequence[int]) -> int:
        """Leading blocks of a prompt that requests running on the worker already hold."""
        blocks = self._blocks.get(worker_id)
        if not blocks:
            return 0
        n = 0
        for h in seq_hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def __len__(self) -> int:
        return len(self._requests)
