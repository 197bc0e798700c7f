"""A radix index of KV blocks: which workers hold which prompt prefixes.

The tree has one node per block *position*: a node is keyed by the block's local hash (XXH3 of
its own tokens) under its parent node, so the path from the root spells a token prefix block by
block, exactly as Dynamo's indexer does. Each node holds the set of workers that cache that block.
Workers name their blocks with their own opaque hashes (``block_hash`` in events, the sequence
hash for the mocker), so every worker has a map ``block_hash -> node`` that resolves the parent of
a store and the target of a removal without searching.

Costs: ``find_matches`` walks the prompt's blocks from the root, so it is O(prompt blocks x
workers still matching), independent of how much is cached. Store and remove are O(blocks in the
event). Memory is bounded by what workers hold: a node lives only while some worker holds it or
one of its descendants, so removals prune the tree back and churn cannot grow it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class _Node:
    __slots__ = ("key", "parent", "children", "workers")

    def __init__(self, key: int, parent: _Node | None):
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.workers: set[str] = set()


class RadixIndex:
    """Prefix index over every worker's cached blocks; single-threaded (one asyncio loop)."""

    def __init__(self) -> None:
        self._root = _Node(0, None)
        self._by_worker: dict[str, dict[int, _Node]] = {}
        self._nodes = 0

    # -- updates -----------------------------------------------------------------------------------

    def store(self, worker_id: str, parent_hash: int | None, blocks: Iterable[tuple[int, int]]) -> bool:
        """Adds a chain of ``(block_hash, local_hash)`` after ``parent_hash`` (None: at the root).

        Returns False, changing nothing, when the worker's parent block is unknown: the router
        missed an event and must resynchronise that worker.
        """
        owned = self._by_worker.setdefault(worker_id, {})
        node: _Node | None
        if parent_hash is None:
            node = self._root
        else:
            node = owned.get(parent_hash)
            if node is None:
                return False
        for block_hash, local_hash in blocks:
            child = node.children.get(local_hash)
            if child is None:
                child = node.children[local_hash] = _Node(local_hash, node)
                self._nodes += 1
            child.workers.add(worker_id)
            owned[block_hash] = child
            node = child
        return True

    def remove(self, worker_id: str, block_hashes: Iterable[int]) -> int:
        """Drops the worker from these blocks; returns how many it was not known to hold."""
        owned = self._by_worker.get(worker_id)
        unknown = 0
        for h in block_hashes:
            node = owned.pop(h, None) if owned is not None else None
            if node is None:
                unknown += 1
                continue
            node.workers.discard(worker_id)
            self._prune(node)
        return unknown

    def clear(self, worker_id: str) -> None:
        """Forgets every block of one worker (a ``cleared`` event, or before loading a full dump)."""
        owned = self._by_worker.get(worker_id)
        if owned is None:
            return
        nodes = list(owned.values())
        owned.clear()
        for node in nodes:
            node.workers.discard(worker_id)
        for node in nodes:
            self._prune(node)

    def drop_worker(self, worker_id: str) -> None:
        """The worker left discovery: its blocks go at once."""
        self.clear(worker_id)
        self._by_worker.pop(worker_id, None)

    def _prune(self, node: _Node) -> None:
        while node.parent is not None and not node.workers and not node.children:
            parent = node.parent
            if parent.children.get(node.key) is node:
                del parent.children[node.key]
                self._nodes -= 1
            node.parent = None
            node = parent

    # -- queries -----------------------------------------------------------------------------------

    def find_matches(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of the prompt it holds (workers with none are absent)."""
        scores: dict[str, int] = {}
        node = self._root
        active: set[str] | None = None
        depth = 0
        for h in local_hashes:
            child = node.children.get(h)
            if child is None or not child.workers:
                break
            if active is None:
                active = set(child.workers)
            elif not active <= child.workers:
                for w in active - child.workers:
                    scores[w] = depth
                active &= child.workers
                if not active:
                    break
            depth += 1
            node = child
        for w in active or ():
            scores[w] = depth
        return scores

    def worker_blocks(self, worker_id: str) -> int:
        """How many blocks the worker is known to hold (its tree size)."""
        return len(self._by_worker.get(worker_id, ()))

    def workers(self) -> list[str]:
        return [w for w, owned in self._by_worker.items() if owned]

    @property
    def node_count(self) -> int:
        """Nodes in the tree besides the root: what memory grows with."""
        return self._nodes

    @property
    def total_blocks(self) -> int:
        return sum(len(owned) for owned in self._by_worker.values())
