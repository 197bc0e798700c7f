"""The simulated KV cache: prefix reuse, reference counts, LRU eviction order and events."""

from __future__ import annotations

import pytest

from services.common.kv_events import StoredBlock
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.sequence import chain_hash, full_blocks

pytestmark = pytest.mark.unit

BS = 4


def blocks_of(tokens: list[int]) -> list[StoredBlock]:
    return full_blocks(tokens, BS)


def hashes(blocks: list[StoredBlock]) -> list[int]:
    return [b.block_hash for b in blocks]


def test_full_blocks_chain_position_into_identity():
    a = blocks_of([1, 2, 3, 4, 5, 6, 7, 8])
    b = blocks_of([9, 9, 9, 9, 5, 6, 7, 8])
    assert a[1].tokens_hash == b[1].tokens_hash  # same tokens
    assert a[1].block_hash != b[1].block_hash  # different prefix, different block
    assert a[1].block_hash == chain_hash(a[0].block_hash, a[1].tokens_hash)
    assert blocks_of([1, 2, 3]) == []  # partial blocks are never hashed


def test_allocate_stores_new_blocks_once_and_shares_them(listener):
    cache = KvCache(16, BS, listener)
    seq = blocks_of(list(range(12)))
    assert cache.allocate(seq, None, partial=1)
    assert listener.events == [("stored", hashes(seq), None)]
    assert cache.active_blocks == 4

    assert cache.allocate(seq, None)  # a second sequence with the same prompt
    assert len(listener.events) == 1  # nothing new stored
    assert [cache.refcount(h) for h in hashes(seq)] == [2, 2, 2]
    assert cache.active_blocks == 4


def test_stored_event_names_the_parent_of_a_new_suffix(listener):
    cache = KvCache(16, BS, listener)
    shared = list(range(8))
    first = blocks_of(shared + [100, 101, 102, 103])
    second = blocks_of(shared + [200, 201, 202, 203])
    cache.allocate(first, None)
    cache.allocate(second, None)
    assert listener.events[1] == ("stored", [second[2].block_hash], second[1].block_hash)


def test_released_blocks_stay_cached_and_are_reused_without_events(listener):
    cache = KvCache(16, BS, listener)
    seq = blocks_of(list(range(12)))
    cache.allocate(seq, None)
    cache.release(hashes(seq))
    assert cache.active_blocks == 0
    assert cache.cached_blocks == 3
    assert cache.match_prefix(hashes(seq)) == 3
    assert cache.allocate(seq, None)
    assert listener.of("stored") == [("stored", hashes(seq), None)]
    assert listener.of("removed") == []
    assert cache.cached_blocks == 0


def test_match_prefix_stops_at_the_first_missing_block():
    cache = KvCache(16, BS)
    seq = blocks_of(list(range(16)))
    cache.allocate(seq[:2], None)
    assert cache.match_prefix(hashes(seq)) == 2
    assert cache.match_prefix(hashes(blocks_of([7] * 16))) == 0


def test_eviction_is_lru_and_suffix_first(listener):
    cache = KvCache(6, BS, listener)
    a = blocks_of([1] * 4 + [2] * 4 + [3] * 4)
    b = blocks_of([4] * 4 + [5] * 4 + [6] * 4)
    cache.allocate(a, None)
    cache.allocate(b, None)
    cache.release(hashes(a))  # A is released first: its blocks are the oldest
    cache.release(hashes(b))
    assert cache.lru_order() == [a[2].block_hash, a[1].block_hash, a[0].block_hash,
                                 b[2].block_hash, b[1].block_hash, b[0].block_hash]

    c = blocks_of([7] * 4 + [8] * 4)
    assert cache.allocate(c, None)
    assert listener.of("removed") == [("removed", [a[2].block_hash, a[1].block_hash])]
    assert cache.match_prefix(hashes(a)) == 1  # A's first block survives, its suffix went first


def test_a_prefix_hit_is_never_evicted_by_its_own_allocation(listener):
    cache = KvCache(3, BS, listener)
    a = blocks_of([1] * 12)
    cache.allocate(a, None)
    cache.release(hashes(a))
    # The same first block plus two new ones: the hit must be revived, the other two evicted.
    b = blocks_of([1] * 4 + [9] * 8)
    assert b[0] == a[0]
    assert cache.allocate(b, None)
    assert listener.of("removed") == [("removed", [a[2].block_hash, a[1].block_hash])]
    assert cache.refcount(a[0].block_hash) == 1


def test_allocation_is_all_or_nothing(listener):
    cache = KvCache(4, BS, listener)
    held = blocks_of(list(range(12)))
    cache.allocate(held, None)
    too_big = blocks_of(list(range(100, 108)))
    assert not cache.allocate(too_big, None)
    assert cache.active_blocks == 3
    assert not cache.allocate((), None, partial=2)
    assert listener.of("stored") == [("stored", hashes(held), None)]
    assert cache.allocate_partial()
    assert cache.free_blocks == 0


def test_commit_partial_turns_a_private_block_into_a_shared_one(listener):
    cache = KvCache(8, BS, listener)
    tokens = list(range(8))
    seq = blocks_of(tokens)
    assert cache.allocate(seq[:1], None, partial=1)
    cache.commit_partial(seq[1], seq[0].block_hash)
    assert listener.of("stored")[-1] == ("stored", [seq[1].block_hash], seq[0].block_hash)
    assert cache.active_blocks == 2

    assert cache.allocate(seq[:1], None, partial=1)  # a twin sequence fills the same block
    cache.commit_partial(seq[1], seq[0].block_hash)
    assert cache.refcount(seq[1].block_hash) == 2
    assert cache.active_blocks == 2
    assert len(listener.of("stored")) == 2


def test_clear_forgets_everything_and_says_so(listener):
    cache = KvCache(8, BS, listener)
    seq = blocks_of(list(range(8)))
    cache.allocate(seq, None, partial=1)
    cache.clear()
    assert listener.events[-1] == ("cleared",)
    assert cache.active_blocks == 0 and cache.cached_blocks == 0
    assert cache.match_prefix(hashes(seq)) == 0


def test_rejects_nonsense_sizes():
    with pytest.raises(ValueError):
        KvCache(0, BS)
    with pytest.raises(ValueError):
        KvCache(4, 0)
    cache = KvCache(4, BS)
    with pytest.raises(ValueError):
        cache.release_partial()
