"""An image's pages in SGLang's KV events, turned back into the tokens and salts the preprocessor hashed.

SGLang's radix cache is keyed by the prompt with each image's placeholder run replaced by *pad values*:
four sentinels derived from the item's 64-bit hash, repeated over the run (``MultimodalDataItem.set_hash``,
``padding_sequence``). The worker hands SGLang the preprocessor's content hash as that item hash
(``mm_hashes``, services/workers/sglang/media.py), so the pad values are a function of the content hash,
and they are what a ``BlockStored`` reports as the image's ``token_ids``. The preprocessor hashed the same
positions as the placeholder id, salting each block with the content hashes of the images it holds
(services/common/hashing.py). To publish the same hashes, the worker maps each page back:

- every pad value becomes the placeholder id the request had at that position, and
- each block lists the content hash of every image run it holds (one entry per item, as
  ``media_block_infos`` counts them: an item's run ends where its pad values stop).

Pad values are one-way (SHA-256 of the hash), so the worker keeps the ones it gave out: ``MediaPads``,
filled as requests are sent, most recent images kept. A page whose pad values the worker did not give (SGLang
padded with its own feature hash: its multimodal preprocess cache or the Qwen3-VL fast path pads before our
hashes are applied) cannot be hashed as the router does; the event is cut before that block and the rest goes
unindexed (the translator then skips its children: their parent is unknown), never guessed.

Pure (numpy, no sglang import): the pad-value function is SGLang's, passed in by kv_events.py.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from services.workers.engine import EngineRequest

# Images whose pad values are kept. Stores are published while their request runs (and a request that
# reuses a cached image registers it again), so this bounds memory without losing an image in flight.
DEFAULT_CAPACITY = 8192


@dataclasses.dataclass(frozen=True, slots=True)
class Restored:
    """The first ``blocks`` blocks of a stored run as the preprocessor hashed them."""

    token_ids: list[int]
    block_mm_infos: list[list[int] | None] | None
    blocks: int
    unknown_pad: int | None = None  # the first pad value the worker did not give, if any


class MediaPads:
    """Which image (content hash) and placeholder id each pad value SGLang uses stands for."""

    def __init__(self, pad_values: Callable[[int], Sequence[int]], min_pad_value: int,
                 capacity: int = DEFAULT_CAPACITY):
        self._pad_values = pad_values  # SGLang's: content hash -> the item's pad sentinels
        self.min_pad_value = min_pad_value  # every pad value is at least this; token ids are below it
        self._capacity = capacity
        self._images: collections.OrderedDict[int, tuple[tuple[int, ...], int]] = collections.OrderedDict()
        self._by_pad: dict[int, tuple[int, int]] = {}  # pad value -> (content hash, placeholder id)

    def __len__(self) -> int:
        return len(self._images)

    def register(self, request: EngineRequest) -> None:
        """Remembers the pad values of the request's placed images (call before SGLang sees it)."""
        for item in request.media:
            if item.token_count <= 0:
                continue  # not placed by the preprocessor: its blocks were hashed unsalted, SGLang's are not
            self._remember(item.content_hash, request.token_ids[item.token_offset])

    def _remember(self, content_hash: int, placeholder: int) -> None:
        known = self._images.get(content_hash)
        if known is not None and known[1] == placeholder:
            self._images.move_to_end(content_hash)
            return
        pads = tuple(int(v) for v in self._pad_values(content_hash))
        if known is not None:
            self._forget(content_hash)
        self._images[content_hash] = (pads, placeholder)
        for pad in pads:
            self._by_pad[pad] = (content_hash, placeholder)
        while len(self._images) > self._capacity:
            self._forget(next(iter(self._images)))

    def _forget(self, content_hash: int) -> None:
        pads, _ = self._images.pop(content_hash)
        for pad in pads:
            del self._by_pad[pad]

    def holds_media(self, token_ids: Sequence[int]) -> bool:
        """Whether a stored page run has pad values (one pass in C; text runs stop here)."""
        return bool(token_ids) and max(token_ids) >= self.min_pad_value

    def restore(self, token_ids: Sequence[int], block_size: int) -> Restored:
        """``token_ids`` (a run of ``block_size`` pages with pad values) as the preprocessor's tokens and salts."""
        ids = np.asarray(token_ids, dtype=np.int64)
        item = np.zeros(len(ids), dtype=np.int64)  # per position: 1 + index into `images`, 0 for text
        images: dict[int, int] = {}  # content hash -> its index + 1, in order of appearance
        for pad in np.unique(ids[ids >= self.min_pad_value]).tolist():
            found = self._by_pad.get(pad)
            if found is None:
                continue  # left as it is, so the cut below finds it
            content_hash, placeholder = found
            at = ids == pad
            ids[at] = placeholder
            item[at] = images.setdefault(content_hash, len(images) + 1)
        blocks = len(ids) // block_size
        unknown: int | None = None
        left = np.flatnonzero(ids >= self.min_pad_value)
        if left.size:
            unknown = int(ids[left[0]])
            blocks = min(blocks, int(left[0]) // block_size)
        end = blocks * block_size
        ids, item = ids[:end], item[:end]
        # An item's run starts where its image does not continue the position before (or at a block's start:
        # a run crossing a block boundary is held by both blocks).
        before = np.concatenate(([0], item[:-1]))
        starts = np.flatnonzero((item != 0) & ((item != before) | (np.arange(end) % block_size == 0)))
        hashes = list(images)
        infos: list[list[int] | None] = [None] * blocks
        for start in starts.tolist():
            held = infos[start // block_size]
            content_hash = hashes[int(item[start]) - 1]
            if held is None:
                infos[start // block_size] = [content_hash]
            else:
                held.append(content_hash)
        return Restored(ids.tolist(), infos if starts.size else None, blocks, unknown)
