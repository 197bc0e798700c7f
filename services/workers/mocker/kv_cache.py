"""A simulated paged KV cache with prefix reuse, reference counts and LRU eviction.

Blocks hold ``block_size`` tokens. A *full* block is identified by its sequence hash (the chained
hash of services.common.hashing, so identity includes every token before it) and can be shared:
several running sequences hold it with a reference count. When the last holder releases it, the
block stays cached in an *inactive* pool, ordered least recently used first, and is evicted only
when a new block needs its slot. A *partial* block (the tail of a sequence, not yet full) is private
and only counted.

Every change that a router would want to know about is reported to a ``KvEventListener``
(services/common/kv_events.py, with ``StoredBlock``):
``stored`` when blocks enter the cache, ``removed`` when evicted ones leave it, ``cleared`` on reset.
Reactivating an inactive block (a prefix hit) is not an event: the block never left.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from services.common.kv_events import KvEventListener, StoredBlock

__all__ = ["KvCache", "KvEventListener", "StoredBlock"]


class KvCache:
    """Block accounting for one engine. All-or-nothing allocation; no partial failures."""

    def __init__(self, num_blocks: int, block_size: int, listener: KvEventListener | None = None):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.listener = listener
        # sequence hash -> reference count (> 0)
        self._active: dict[int, int] = {}
        # sequence hash -> None; the first entry is the least recently used
        self._inactive: OrderedDict[int, None] = OrderedDict()
        self._partial = 0

    # -- inspection ------------------------------------------------------------------------------

    @property
    def active_blocks(self) -> int:
        """Blocks some running sequence holds (shared full blocks count once)."""
        return len(self._active) + self._partial

    @property
    def cached_blocks(self) -> int:
        """Free blocks that still hold reusable content."""
        return len(self._inactive)

    @property
    def free_blocks(self) -> int:
        """Blocks a new allocation may take (empty ones plus evictable cached ones)."""
        return self.num_blocks - self.active_blocks

    def refcount(self, block_hash: int) -> int:
        return self._active.get(block_hash, 0)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._active or block_hash in self._inactive

    def lru_order(self) -> list[int]:
        """Inactive blocks, next eviction first."""
        return list(self._inactive)

    def match_prefix(self, seq_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``seq_hashes`` are in the cache."""
        n = 0
        for h in seq_hashes:
            if h not in self._active and h not in self._inactive:
                break
            n += 1
        return n

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, blocks: Sequence[StoredBlock], parent_hash: int | None, partial: int = 0) -> bool:
        """Takes a reference on each full block (storing missing ones) plus ``partial`` private blocks.

        ``blocks`` is a consecutive run of one sequence's blocks starting after ``parent_hash``.
        Returns False, changing nothing, when the cache cannot hold them all.
        """
        new = sum(1 for b in blocks if b.block_hash not in self._active and b.block_hash not in self._inactive)
        revived = [b.block_hash for b in blocks if b.block_hash in self._inactive]
        empty = self.num_blocks - len(self._active) - len(self._inactive) - self._partial
        if new + partial > empty + len(self._inactive) - len(revived):
            return False
        # Take the prefix hits out of the LRU pool first so the eviction below cannot pick them.
        for h in revived:
            del self._inactive[h]
            self._active[h] = 0
        self._evict(new + partial - empty)
        stored: list[StoredBlock] = []
        run_parent = parent_hash
        for b in blocks:
            h = b.block_hash
            if h in self._active:
                self._active[h] += 1
            else:
                self._active[h] = 1
                stored.append(b)
                continue
            self._emit_stored(stored, run_parent)
            stored = []
            run_parent = h
        self._emit_stored(stored, run_parent)
        self._partial += partial
        return True

    def allocate_partial(self) -> bool:
        """Takes one private block for a sequence's growing tail."""
        return self.allocate((), None, partial=1)

    def release_partial(self, count: int = 1) -> None:
        if count > self._partial:
            raise ValueError("releasing more partial blocks than allocated")
        self._partial -= count

    def commit_partial(self, block: StoredBlock, parent_hash: int | None) -> None:
        """A private tail block just filled up: it becomes a shareable full block.

        If another sequence already stored the same block, this one shares it and the private
        slot is simply returned.
        """
        self.release_partial()
        if not self.allocate((block,), parent_hash):  # cannot happen: we just freed a slot
            raise RuntimeError("KV cache accounting error while committing a block")

    def release(self, seq_hashes: Sequence[int]) -> None:
        """Drops one reference on each block; unreferenced ones become cached (LRU).

        Blocks are released tail first, so a sequence's suffix is evicted before its prefix, which
        other requests are more likely to share.
        """
        for h in reversed(seq_hashes):
            count = self._active[h]
            if count > 1:
                self._active[h] = count - 1
            else:
                del self._active[h]
                self._inactive[h] = None

    def clear(self) -> None:
        """Forgets every block, held or cached (engine reset)."""
        self._active.clear()
        self._inactive.clear()
        self._partial = 0
        if self.listener is not None:
            self.listener.cleared()

    # -- internals -------------------------------------------------------------------------------

    def _evict(self, count: int) -> None:
        if count <= 0:
            return
        evicted = []
        for _ in range(count):
            h, _ = self._inactive.popitem(last=False)
            evicted.append(h)
        if self.listener is not None:
            self.listener.removed(evicted)

    def _emit_stored(self, blocks: list[StoredBlock], parent_hash: int | None) -> None:
        if blocks and self.listener is not None:
            self.listener.stored(blocks, parent_hash)
