"""KV block hashes, bit-exact with Dynamo's (lib/kv-router/src/protocols.rs).

- Only full blocks of ``block_size`` tokens are hashed; a trailing partial block is ignored.
- Local block hash: XXH3-64 over the block's token ids as little-endian u32, with seed 1337, or, for a
  request naming a LoRA adapter, seed ``(1337 + XXH3-64_seed0(utf8(lora_name))) mod 2**64`` (Dynamo's
  ``compute_block_hash_for_seq(tokens, block_size, block_mm_infos, lora_name)``; an empty name is no
  adapter).
- A block that holds (part of) a multimodal item hashes its tokens followed by the content hashes of
  the items it holds, sorted ascending, each as little-endian u64 (Dynamo's ``block_mm_infos``). The
  blocks after it differ through the chain below, so a KV hit is predicted for the same image and never
  for a different one.
- Sequence hash (position identity): seq[0] = local[0];
  seq[i] = XXH3-64_seed1337(le_u64(seq[i-1]) || le_u64(local[i])) (the chain seed is always 1337).

Without ``block_mm_infos`` and ``lora_name`` the hashes are the plain ones, pinned by literal golden
vectors in tests/golden/kv_block_hashes.json (the salted ones too).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import xxhash

SEED = 1337
DEFAULT_BLOCK_SIZE = 16
_U64_PAIR = struct.Struct("<QQ")
_MASK64 = (1 << 64) - 1

# Per block: the content hashes of the media items whose tokens it holds, or None for a text-only block.
BlockMmInfos = Sequence[Sequence[int] | None]


def _le_u32_bytes(token_ids: Sequence[int]) -> bytes:
    arr = array("I", token_ids)
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has 4-byte unsigned int
        raise RuntimeError("array('I') is not 32-bit on this platform")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def lora_seed(lora_name: str | None) -> int:
    """The local-hash seed for a request under ``lora_name`` (None or "": the base model's 1337)."""
    if not lora_name:
        return SEED
    return (SEED + xxhash.xxh3_64_intdigest(lora_name.encode("utf-8"))) & _MASK64


def block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, *,
                 block_mm_infos: BlockMmInfos | None = None, lora_name: str | None = None) -> list[int]:
    """Local hashes of each full block of ``token_ids``.

    ``block_mm_infos[i]`` lists the media content hashes block ``i`` holds (see ``media_block_infos``);
    blocks past its end, and None entries, are text-only. ``lora_name`` salts every block's seed.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    raw = _le_u32_bytes(token_ids)
    stride = block_size * 4
    full = len(token_ids) // block_size
    seed = lora_seed(lora_name)
    h = xxhash.xxh3_64_intdigest
    out = [h(raw[i * stride:(i + 1) * stride], seed=seed) for i in range(full)]
    if block_mm_infos:
        # Only the blocks that hold media are rehashed: the text path above stays one slice per block.
        for i, mm_hashes in enumerate(block_mm_infos[:full]):
            if mm_hashes:
                salt = struct.pack(f"<{len(mm_hashes)}Q", *sorted(mm_hashes))
                out[i] = h(raw[i * stride:(i + 1) * stride] + salt, seed=seed)
    return out


def media_block_infos(spans: Sequence[tuple[int, int, int]], block_size: int = DEFAULT_BLOCK_SIZE
                      ) -> list[list[int] | None]:
    """Per block, the content hashes of the media whose placeholder tokens it holds.

    ``spans`` are ``(offset, length, content_hash)``: a media item occupying prompt positions
    ``[offset, offset + length)``. The list ends at the last block that holds media.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    infos: list[list[int] | None] = []
    for offset, length, content_hash in spans:
        if length <= 0:
            continue
        first, last = offset // block_size, (offset + length - 1) // block_size
        if len(infos) <= last:
            infos.extend([None] * (last + 1 - len(infos)))
        for b in range(first, last + 1):
            # One entry per item, like Dynamo's mm_objects: the same image twice in a block counts twice.
            held = infos[b]
            if held is None:
                infos[b] = [content_hash]
            else:
                held.append(content_hash)
    return infos


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
