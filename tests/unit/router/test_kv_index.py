"""The radix index, the event ingest (gaps, dumps) and the approximate cache."""

from __future__ import annotations

import random
import time

import pytest

from services.common.hashing import block_hashes, chain_hash, sequence_hashes
from services.common.kv_events import StoredBlock
from services.router.core.approximate import ApproximateCache
from services.router.core.index import RadixIndex
from services.router.core.kv_ingest import KvEventIngest, Verdict
from services.workers.kv_events import BlockMirror

pytestmark = pytest.mark.unit


def chain(tokens: list[int], bs: int = 4) -> tuple[list[int], list[int]]:
    local = block_hashes(tokens, bs)
    return sequence_hashes(local), local


def test_chain_hash_matches_sequence_hashes():
    local = block_hashes(list(range(64)), 16)
    seq = sequence_hashes(local)
    parent = None
    for i, h in enumerate(local):
        parent = chain_hash(parent, h)
        assert parent == seq[i]


def test_find_matches_counts_leading_blocks_per_worker():
    index = RadixIndex()
    seq, local = chain(list(range(16)))  # 4 blocks
    assert index.store("a", None, zip(seq, local, strict=True))
    assert index.store("b", None, zip(seq[:2], local[:2], strict=True))
    assert index.find_matches(local) == {"a": 4, "b": 2}
    assert index.find_matches(local[:1]) == {"a": 1, "b": 1}
    # A different first block shares nothing, even if later blocks are equal.
    assert index.find_matches([12345, *local[1:]]) == {}


def test_store_after_unknown_parent_is_refused():
    index = RadixIndex()
    assert not index.store("a", 999, [(1, 2)])
    assert index.node_count == 0


def test_removal_prunes_and_keeps_other_workers():
    index = RadixIndex()
    seq, local = chain(list(range(16)))
    index.store("a", None, zip(seq, local, strict=True))
    index.store("b", None, zip(seq, local, strict=True))
    index.remove("a", seq[2:])
    assert index.find_matches(local) == {"a": 2, "b": 4}
    index.drop_worker("b")
    assert index.find_matches(local) == {"a": 2}
    assert index.node_count == 2
    index.clear("a")
    assert index.node_count == 0 and index.find_matches(local) == {}


def test_position_matters_same_block_under_another_parent():
    index = RadixIndex()
    tokens_x = [1, 2, 3, 4, 9, 9, 9, 9]
    tokens_y = [5, 6, 7, 8, 9, 9, 9, 9]
    for w, toks in (("a", tokens_x), ("b", tokens_y)):
        seq, local = chain(toks)
        index.store(w, None, zip(seq, local, strict=True))
    _, local_x = chain(tokens_x)
    assert index.find_matches(local_x) == {"a": 2}


def test_churn_keeps_memory_bounded_and_time_small():
    """32 workers, 1M block events (stores and evictions) over a shared-prefix workload."""
    rng = random.Random(7)
    index = RadixIndex()
    workers = [f"w{i}" for i in range(32)]
    held: dict[str, list[list[int]]] = {w: [] for w in workers}
    prefixes = [[rng.randrange(1 << 30) for _ in range(8)] for _ in range(64)]
    events = 0
    start = time.perf_counter()
    n = 0
    while events < 1_000_000:
        w = workers[n % len(workers)]
        n += 1
        local = prefixes[rng.randrange(64)] + [rng.randrange(1 << 62) for _ in range(8)]
        seq = sequence_hashes(local)
        index.store(w, None, zip(seq, local, strict=True))
        held[w].append(seq)
        events += len(seq)
        if len(held[w]) > 20:  # each worker's cache holds ~20 prompts: evict the oldest
            old = held[w].pop(0)
            index.remove(w, old)
            events += len(old)
    elapsed = time.perf_counter() - start
    live = sum(len(set(h for s in seqs for h in s)) for seqs in held.values())
    assert index.total_blocks <= live
    assert index.node_count <= live  # nothing leaks past what workers hold
    assert elapsed < 20, elapsed
    # Lookup cost tracks the prompt, not the index size.
    probe = prefixes[0] + [1] * 56
    t0 = time.perf_counter()
    for _ in range(1000):
        index.find_matches(probe)
    assert (time.perf_counter() - t0) / 1000 < 0.002


def _msg(worker, seq, events):
    return {"worker_id": worker, "seq": seq, "events": events}


def _stored(seq_hashes, local, parent=None):
    return {"stored": {"parent_hash": parent, "blocks": [{"block_hash": s, "tokens_hash": t}
                                                         for s, t in zip(seq_hashes, local, strict=True)]}}


def test_ingest_new_worker_buffers_until_dump_then_replays_newer():
    ingest = KvEventIngest()
    seq, local = chain(list(range(16)))
    assert ingest.on_message(_msg("w", 3, [_stored(seq[:2], local[:2])])) is Verdict.RESYNC
    assert ingest.on_message(_msg("w", 4, [_stored(seq[2:], local[2:], parent=seq[1])])) is Verdict.BUFFERED
    # The dump is as of seq 3: it holds the first two blocks; message 4 is replayed on top.
    dump = [[seq[0], None, local[0]], [seq[1], seq[0], local[1]]]
    assert ingest.load_dump("w", 3, dump) is Verdict.APPLIED
    assert ingest.index.find_matches(local) == {"w": 4}
    assert ingest.on_message(_msg("w", 4, [])) is Verdict.DUPLICATE
    assert ingest.on_message(_msg("w", 5, [{"removed": {"block_hashes": seq[3:]}}])) is Verdict.APPLIED
    assert ingest.index.find_matches(local) == {"w": 3}


def test_ingest_gap_triggers_resync_and_counts():
    ingest = KvEventIngest()
    ingest.begin_sync("w")
    ingest.load_dump("w", 0, [])
    seq, local = chain(list(range(16)))
    assert ingest.on_message(_msg("w", 1, [_stored(seq, local)])) is Verdict.APPLIED
    assert ingest.on_message(_msg("w", 3, [{"cleared": {}}])) is Verdict.RESYNC
    assert ingest.stats.gaps == 1 and ingest.needs_dump("w")
    # Until the dump arrives the old state still answers (better than nothing).
    assert ingest.index.find_matches(local) == {"w": 4}
    ingest.load_dump("w", 3, [])
    assert ingest.index.find_matches(local) == {}


def test_ingest_unknown_parent_means_resync():
    ingest = KvEventIngest()
    ingest.load_dump("w", 0, [])
    assert ingest.on_message(_msg("w", 1, [_stored([5], [6], parent=77)])) is Verdict.RESYNC
    assert ingest.stats.unknown_parents == 1


def test_ingest_drop_worker_forgets_everything():
    ingest = KvEventIngest()
    ingest.load_dump("w", 0, [])
    seq, local = chain(list(range(8)))
    ingest.on_message(_msg("w", 1, [_stored(seq, local)]))
    ingest.drop_worker("w")
    assert ingest.index.find_matches(local) == {} and ingest.index.node_count == 0
    assert ingest.needs_dump("w")


def test_block_mirror_dump_orders_parents_first_and_skips_orphans():
    m = BlockMirror()
    seq, local = chain(list(range(16)))
    m.stored([StoredBlock(s, t) for s, t in zip(seq, local, strict=True)], None)
    m.removed([seq[0]])  # orphan the rest
    m.stored([StoredBlock(seq[0], local[0])], None)  # re-stored after its children
    dump = m.dump()
    assert [d[0] for d in dump] == seq
    index = RadixIndex()
    for h, parent, loc in dump:
        assert index.store("w", parent, [(h, loc)])
    m.removed([seq[1]])
    assert [d[0] for d in m.dump()] == [seq[0]]


def test_approximate_cache_expires_and_prunes():
    now = [0.0]
    index = RadixIndex()
    cache = ApproximateCache(index, ttl_s=10, max_blocks=6, prune_ratio=0.5, clock=lambda: now[0])
    seq, local = chain(list(range(16)))
    cache.record("a", seq, local)
    assert index.find_matches(local) == {"a": 4}
    now[0] = 5
    cache.record("a", seq[:2], local[:2])  # renews the first two blocks
    now[0] = 12
    cache.expire()
    assert index.find_matches(local) == {"a": 2}
    seq2, local2 = chain(list(range(100, 120)))
    cache.record("b", seq2, local2)  # 2 + 5 blocks > 6: prune the oldest down to 3
    assert len(cache) == 3
