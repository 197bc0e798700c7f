"""KV block hashes, bit-exact with Dynamo's (lib/kv-router/src/protocols.rs).

- Only full blocks of ``block_size`` tokens are hashed; a trailing partial block is ignored.
- Local block hash: XXH3-64, seed 1337, over the block's token ids as little-endian u32.
- Sequence hash (position identity): seq[0] = local[0];
  seq[i] = XXH3-64_seed1337(le_u64(seq[i-1]) || le_u64(local[i])).

Pinned by literal golden vectors in tests/golden/kv_block_hashes.json.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import xxhash

SEED = 1337
DEFAULT_BLOCK_SIZE = 16
_U64_PAIR = struct.Struct("<QQ")


def _le_u32_bytes(token_ids: Sequence[int]) -> bytes:
    arr = array("I", token_ids)
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has 4-byte unsigned int
        raise RuntimeError("array('I') is not 32-bit on this platform")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """Local hashes of each full block of ``token_ids``."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    raw = _le_u32_bytes(token_ids)
    stride = block_size * 4
    full = len(token_ids) // block_size
    h = xxhash.xxh3_64_intdigest
    return [h(raw[i * stride:(i + 1) * stride], seed=SEED) for i in range(full)]


def chain_hash(parent: int | None, local: int) -> int:
    """The sequence hash of a block with local hash ``local`` following ``parent`` (None: the first block)."""
    return local if parent is None else xxhash.xxh3_64_intdigest(_U64_PAIR.pack(parent, local), seed=SEED)


def sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chained hashes: each one identifies a block together with every block before it."""
    out: list[int] = []
    h = xxhash.xxh3_64_intdigest
    for i, local in enumerate(local_hashes):
        out.append(local if i == 0 else h(_U64_PAIR.pack(out[-1], local), seed=SEED))
    return out
