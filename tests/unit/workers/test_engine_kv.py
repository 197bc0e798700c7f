"""An engine's KV events (vLLM/SGLang shapes) become Meshfront hashes equal to the preprocessor's."""

from __future__ import annotations

import pytest

from services.common.hashing import block_hashes, sequence_hashes
from services.workers.engine_kv import BlockHashTranslator, BlocksRemoved, BlocksStored, CacheCleared
from services.workers.kv_events import BlockMirror

pytestmark = pytest.mark.unit

BS = 4
TOKENS = list(range(100, 124))  # six full blocks


class Recorder:
    def __init__(self):
        self.calls = []
        self.mirror = BlockMirror()

    def stored(self, blocks, parent_hash):
        self.calls.append(("stored", [b.block_hash for b in blocks], parent_hash))
        self.mirror.stored(blocks, parent_hash)

    def removed(self, hashes):
        self.calls.append(("removed", list(hashes)))
        self.mirror.removed(hashes)

    def cleared(self):
        self.calls.append(("cleared",))
        self.mirror.cleared()


def ours(tokens):
    return sequence_hashes(block_hashes(tokens, BS))


def store(t, engine_hashes, parent, start_block):
    t.apply(BlocksStored(engine_hashes, parent, TOKENS[start_block * BS:(start_block + len(engine_hashes)) * BS], BS))


def test_stored_chains_hash_like_the_preprocessor_across_events():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    store(t, ["e0", "e1"], None, 0)
    store(t, ["e2", "e3", "e4"], "e1", 2)  # the engine's parent hash, not ours
    expected = ours(TOKENS[:5 * BS])
    assert rec.calls == [("stored", expected[:2], None), ("stored", expected[2:], expected[1])]
    assert [row[0] for row in rec.mirror.dump()] == expected


def test_removals_carry_engine_hashes_and_leave_with_ours():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    store(t, ["e0", "e1", "e2"], None, 0)
    t.apply(BlocksRemoved(["e2", "unknown"]))
    assert rec.calls[-1] == ("removed", [ours(TOKENS[:3 * BS])[2]])
    assert len(t) == 2


def test_partial_and_orphan_blocks_are_never_indexed():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    t.apply(BlocksStored(["p"], None, TOKENS[:2], 2))  # a partial block (vLLM reports those too)
    t.apply(BlocksStored(["e1"], "never-seen", TOKENS[BS:2 * BS], BS))  # its parent's store was lost
    assert rec.calls == [] and t.skipped_blocks == 1
    t.apply(BlocksRemoved(["p", "e1"]))
    assert rec.calls == []


def test_reannounced_blocks_are_not_stored_twice_and_chains_continue_after_them():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    store(t, ["e0", "e1"], None, 0)
    store(t, ["e0", "e1", "e2"], None, 0)  # vLLM re-announces prefix-cache hits, then stores a new block
    expected = ours(TOKENS[:3 * BS])
    assert rec.calls[-1] == ("stored", [expected[2]], expected[1])
    assert len(rec.calls) == 2


def test_two_engine_hashes_for_the_same_tokens_share_ours_until_both_are_gone():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    store(t, ["a0"], None, 0)
    store(t, ["b0"], None, 0)  # same tokens, another engine hash (a LoRA or a cache salt)
    assert len(rec.calls) == 1
    t.apply(BlocksRemoved(["a0"]))
    assert len(rec.calls) == 1
    t.apply(BlocksRemoved(["b0"]))
    assert rec.calls[-1] == ("removed", ours(TOKENS[:BS]))


def test_cleared_forgets_every_mapping():
    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    store(t, ["e0"], None, 0)
    t.apply(CacheCleared())
    assert rec.calls[-1] == ("cleared",) and len(t) == 0
    store(t, ["e1"], "e0", 1)  # its parent went with the clear
    assert t.skipped_blocks == 1


def test_a_block_holding_an_image_is_salted_with_its_content_hash_like_the_prompts():
    from services.common.hashing import media_block_infos

    rec = Recorder()
    t = BlockHashTranslator(rec, BS)
    spans = [(5, 6, 0xFEED)]  # an image's placeholder tokens at positions 5..10: blocks 1 and 2
    infos = media_block_infos(spans, BS)
    t.apply(BlocksStored(["e0", "e1", "e2", "e3"], None, TOKENS[:4 * BS], BS, block_mm_infos=infos))
    expected = sequence_hashes(block_hashes(TOKENS[:4 * BS], BS, block_mm_infos=infos))
    assert rec.calls == [("stored", expected, None)]
    assert expected[0] == ours(TOKENS[:BS])[0] and expected[1:] != ours(TOKENS[:4 * BS])[1:]
