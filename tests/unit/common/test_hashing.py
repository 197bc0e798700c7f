"""KV block hashes against literal golden vectors (tests/golden/kv_block_hashes.json).

The vectors pin bit-exactness with Dynamo: the first one is the known-answer check from Dynamo's
"KV Events & Hashing Consistency" guide; the rest were produced by this implementation of the
same algorithm (lib/kv-router/src/protocols.rs) and must never change.
"""

from __future__ import annotations

import json
import pathlib
import struct

import pytest
import xxhash

from services.common.hashing import (
    DEFAULT_BLOCK_SIZE,
    SEED,
    block_hashes,
    lora_seed,
    media_block_infos,
    sequence_hashes,
)

pytestmark = pytest.mark.unit

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "golden" / "kv_block_hashes.json"
VECTORS = json.loads(GOLDEN.read_text())["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_local_hashes_match_golden(vector):
    got = block_hashes(vector["tokens"], vector["block_size"], block_mm_infos=vector.get("block_mm_infos"),
                       lora_name=vector.get("lora_name"))
    assert got == vector["local_hashes"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_sequence_hashes_match_golden(vector):
    assert sequence_hashes(vector["local_hashes"]) == vector["sequence_hashes"]


def test_dynamo_known_answer():
    assert block_hashes([1, 2, 3, 4], 4) == [14643705804678351452]


def test_constants():
    assert SEED == 1337
    assert DEFAULT_BLOCK_SIZE == 16


def test_partial_trailing_block_is_ignored():
    tokens = list(range(100, 148))  # three full blocks of 16
    full = block_hashes(tokens, 16)
    assert len(full) == 3
    for extra in range(1, 16):
        assert block_hashes(tokens + list(range(extra)), 16) == full


def test_local_hash_depends_only_on_its_block():
    a = block_hashes([1] * 16 + [2] * 16, 16)
    b = block_hashes([3] * 16 + [2] * 16, 16)
    assert a[0] != b[0] and a[1] == b[1]  # same tokens in block 1 -> same local hash


def test_sequence_hash_chains_the_prefix():
    a = sequence_hashes(block_hashes([1] * 16 + [2] * 16, 16))
    b = sequence_hashes(block_hashes([3] * 16 + [2] * 16, 16))
    assert a[1] != b[1]  # same block, different prefix -> different position identity


def test_sequence_recurrence_by_hand():
    local = block_hashes(list(range(48)), 16)
    expected = [local[0]]
    for h in local[1:]:
        expected.append(xxhash.xxh3_64_intdigest(struct.pack("<QQ", expected[-1], h), seed=1337))
    assert sequence_hashes(local) == expected


def test_local_hash_is_xxh3_over_little_endian_u32():
    tokens = [1, 256, 65536, 4294967295]
    raw = b"".join(struct.pack("<I", t) for t in tokens)
    assert block_hashes(tokens, 4) == [xxhash.xxh3_64_intdigest(raw, seed=1337)]


def test_tuple_and_list_inputs_agree():
    assert block_hashes(tuple(range(32)), 16) == block_hashes(list(range(32)), 16)


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], 0)


# --- LoRA and multimodal salts (Dynamo's compute_block_hash_for_seq(tokens, bs, block_mm_infos, lora_name)) ---

def test_lora_seed_is_1337_plus_xxh3_of_the_name():
    assert lora_seed(None) == lora_seed("") == SEED
    assert lora_seed("a") == (1337 + xxhash.xxh3_64_intdigest(b"a")) % 2**64
    tokens = list(range(8))
    raw = struct.pack("<4I", 0, 1, 2, 3)
    assert block_hashes(tokens, 4, lora_name="a")[0] == xxhash.xxh3_64_intdigest(raw, seed=lora_seed("a"))


def test_lora_salts_every_block_and_adapters_differ():
    tokens = list(range(64))
    base = block_hashes(tokens, 16)
    a = block_hashes(tokens, 16, lora_name="a")
    b = block_hashes(tokens, 16, lora_name="b")
    assert all(x != y for x, y in zip(base, a, strict=True))
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert block_hashes(tokens, 16, lora_name="a") == a


def test_mm_block_hash_appends_sorted_le_u64_content_hashes():
    tokens = [5] * 8
    raw = struct.pack("<4I", 5, 5, 5, 5)
    got = block_hashes(tokens, 4, block_mm_infos=[[9, 3]])
    assert got[0] == xxhash.xxh3_64_intdigest(raw + struct.pack("<QQ", 3, 9), seed=1337)
    assert got[1] == block_hashes(tokens, 4)[1]  # past the infos' end: text-only


def test_same_image_same_hashes_different_image_different_chain():
    tokens = list(range(48))
    infos_a = media_block_infos([(10, 8, 111)], 16)
    infos_b = media_block_infos([(10, 8, 222)], 16)
    a = sequence_hashes(block_hashes(tokens, 16, block_mm_infos=infos_a))
    assert a == sequence_hashes(block_hashes(tokens, 16, block_mm_infos=media_block_infos([(10, 8, 111)], 16)))
    b = sequence_hashes(block_hashes(tokens, 16, block_mm_infos=infos_b))
    plain = sequence_hashes(block_hashes(tokens, 16))
    assert a[0] != b[0] and a[0] != plain[0]  # the block holding the image
    assert a[1] != b[1] and a[2] != b[2]  # every block after it, through the chain


def test_empty_or_none_infos_are_plain():
    tokens = list(range(32))
    assert block_hashes(tokens, 16, block_mm_infos=[None, []]) == block_hashes(tokens, 16)
    assert block_hashes(tokens, 16, block_mm_infos=[]) == block_hashes(tokens, 16)


def test_media_block_infos_marks_every_block_a_span_touches():
    assert media_block_infos([(14, 4, 7)], 16) == [[7], [7]]  # positions 14..17 straddle blocks 0 and 1
    assert media_block_infos([(16, 16, 7)], 16) == [None, [7]]
    assert media_block_infos([(0, 2, 1), (5, 3, 2), (40, 1, 1)], 16) == [[1, 2], None, [1]]
    assert media_block_infos([(3, 0, 9)], 16) == []
    with pytest.raises(ValueError):
        media_block_infos([(0, 1, 1)], 0)
