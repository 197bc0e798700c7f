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

from services.common.hashing import DEFAULT_BLOCK_SIZE, SEED, block_hashes, sequence_hashes

pytestmark = pytest.mark.unit

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "golden" / "kv_block_hashes.json"
VECTORS = json.loads(GOLDEN.read_text())["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_local_hashes_match_golden(vector):
    assert block_hashes(vector["tokens"], vector["block_size"]) == vector["local_hashes"]


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
