"""Tokenize once per conversation: a prompt whose rendered text extends an earlier prompt's reuses that prompt's
token ids and encodes only the rest (issue 40, item 2).

Where it may cut. A tokenizer splits the text on its added tokens (``<|im_start|>``, ``<|im_end|>``, BOS, ...)
before normalising, pre-tokenizing and merging each piece on its own, so no token ever crosses the start of
an added token. The ids of ``text[:p]``, where an added token starts at ``p``, are therefore the first ids of
``text`` whatever follows ``p``; ``text[p:]`` encoded alone gives the rest. That holds for the added tokens
matched on the raw text (``normalized=False``) that take no neighbouring whitespace (no ``lstrip``/``rstrip``/
``single_word``); a tokenizer with such a token taking whitespace has no safe cut and is never cached.
Cutting at a message's marker, and not at the longest common prefix, is also what makes the chat template's
last turn safe: the generation prompt, the thinking block a template drops from earlier assistant turns and
any other re-rendering of the tail all lie after the cut, and are encoded again.

How a prompt finds its earlier turn. Every cut point of a cached prompt is indexed by a chained hash of the
text before it (``hash((previous, segment))``, one pass over the text). A new prompt computes the same chain
over its own cut points and takes the last one that is indexed; the two texts are then compared up to it
(one memcmp), so a hash collision costs a full encode, never a wrong id.

What it checks each time (cheaply, no second encode): the suffix's first id is the added token at the cut, and
the suffix's ids hold each added token of its text, in order and as many times: if the tokenizer split differently
than predicted (an encoder that handles added tokens its own way), the prompt is encoded whole instead.

Keys: the model directory and its encoder object (``--tokenizer`` default and fastokens never share ids), then
the text. Templates, tools, thinking kwargs and LoRA adapters need no key of their own: they change the
rendered text, and a given encoder maps a given text to one list of ids. Memory is bounded by an LRU over
entries, sized in bytes (text, ids at 36 bytes each as a Python list, cut points).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from services.common.tokenizer_kinds.fast_encoder import Encoder

# A cut costs an index slot and its key and value tuples, and two list items; an id a list slot and an int object.
_BYTES_PER_CUT = 136
_BYTES_PER_ID = 36
_SEED = 0x9E3779B97F4A7C15


@dataclasses.dataclass(frozen=True)
class Cuts:
    """A tokenizer's safe cut points: the added tokens matched on raw text, as one leftmost-longest regex."""

    pattern: re.Pattern[str]
    ids: dict[str, int]  # token text -> id

    @staticmethod
    def of(added: dict[int, Any]) -> Cuts | None:
        """From ``Tokenizer.get_added_tokens_decoder()``; None when some raw-text added token takes whitespace
        around it (its match would move a cut) or there are none."""
        raw = {t.content: i for i, t in added.items() if not t.normalized and t.content}
        if not raw or any(t.lstrip or t.rstrip or t.single_word for t in added.values() if not t.normalized):
            return None
        # Longest first: Python's alternation takes the first branch that matches, the tokenizer the longest.
        alternatives = sorted(raw, key=len, reverse=True)
        return Cuts(re.compile("|".join(map(re.escape, alternatives))), raw)


@dataclasses.dataclass
class _Entry:
    model: str
    text: str
    ids: list[int]  # of the whole text: a list, since slicing one costs a memcpy and an array's tolist() 10x that
    positions: list[int]  # where each cut's added token starts in text
    token_index: list[int]  # that token's index in ids
    keys: list[tuple[str, int]]
    size: int
    live: int = 0  # index keys still pointing here; at 0 nothing can find the entry


@dataclasses.dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0
    fallbacks: int = 0  # the suffix did not split as predicted: encoded whole
    evictions: int = 0


# Every live cache in the process, for the preprocessor's metrics (read at scrape time, not per request).
LIVE: weakref.WeakSet[PrefixCache] = weakref.WeakSet()


class PrefixCache:
    """Token ids of recent prompts, per model, reused by prompts that extend them.

    ``encode(model_dir, encoder, cuts, text, encode_fn)`` returns exactly ``encode_fn(text)``. Thread-safe:
    large prompts are encoded on worker threads (service.py), the bookkeeping is under one lock, the encoding
    outside it."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self.stats = Stats()
        self._lru: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._index: dict[tuple[str, int], tuple[_Entry, int]] = {}
        self._encoders: dict[str, Encoder] = {}
        self._lock = threading.Lock()
        LIVE.add(self)

    def __len__(self) -> int:
        return len(self._lru)

    def encode(self, model_dir: str, encoder: Encoder, cuts: Cuts | None, text: str,
               encode_fn: Callable[[str], list[int]]) -> list[int]:
        if cuts is None or self.capacity_bytes <= 0 or "\0" in text:
            return encode_fn(text)  # NULs are removed before encoding: positions would not line up
        matches = [(m.start(), m.group()) for m in cuts.pattern.finditer(text)]
        if not matches:
            return encode_fn(text)
        hashes = _chain(text, matches)
        with self._lock:
            self._check_encoder(model_dir, encoder)
            found = self._find(model_dir, text, matches, hashes)
        if found is None:
            start, head, positions, token_index = 0, [], [], []
        else:
            entry, j = found
            start, head = matches[j][0], entry.ids[:entry.token_index[j]]
            positions, token_index = entry.positions[:j], entry.token_index[:j]
        tail = encode_fn(text[start:])
        mapped = _map_cuts(tail, [m for m in matches if m[0] >= start], cuts.ids, len(head))
        if mapped is None:  # not split as predicted: the whole text, encoded as if there were no cache
            with self._lock:
                self.stats.fallbacks += 1
            return encode_fn(text) if start else tail
        ids = head + tail
        with self._lock:
            if found is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
                self.stats.reused_tokens += len(head)
            self.stats.encoded_tokens += len(tail)
            if self._encoders.get(model_dir) is not encoder:
                return ids  # the model was loaded again while this one encoded: keep nothing of the old encoder
            self._insert(model_dir, text, ids, positions + [p for p, _ in matches[len(positions):]],
                         token_index + mapped, hashes)
        return ids

    def _check_encoder(self, model_dir: str, encoder: Encoder) -> None:
        """A model directory loaded again (another encoder object) drops what the old one encoded."""
        known = self._encoders.get(model_dir)
        if known is encoder:
            return
        if known is not None:
            for key, entry in list(self._lru.items()):
                if entry.model == model_dir:
                    self._drop(key, entry)
        self._encoders[model_dir] = encoder

    def _find(self, model_dir: str, text: str, matches: list[tuple[int, str]],
              hashes: list[int]) -> tuple[_Entry, int] | None:
        """The cached entry sharing the longest cut-aligned prefix with ``text``, and that cut's number."""
        for j in range(len(matches) - 1, -1, -1):
            p = matches[j][0]
            if p == 0:
                break  # nothing before it to reuse
            hit = self._index.get((model_dir, hashes[j]))
            if hit is None:
                continue
            entry, k = hit
            # k == j: the same number of cuts before p; the texts before p equal: the same ids before p.
            if k == j and entry.positions[k] == p and entry.text[:p] == text[:p]:
                self._lru.move_to_end(id(entry))
                return entry, j
        return None

    def _insert(self, model_dir: str, text: str, ids: list[int], positions: list[int], token_index: list[int],
                hashes: list[int]) -> None:
        if not positions or positions[-1] == 0:
            return  # no cut with anything before it: nothing could reuse this prompt
        keys = [(model_dir, h) for h in hashes]
        size = sys.getsizeof(text) + _BYTES_PER_ID * len(ids) + _BYTES_PER_CUT * len(keys)
        if size > self.capacity_bytes:
            return
        entry = _Entry(model_dir, text, list(ids), positions, token_index, keys, size)  # a copy: callers own theirs
        for j, key in enumerate(keys):
            if positions[j] == 0:
                continue  # every conversation's: _find never looks it up
            old = self._index.get(key)
            if old is not None:
                old[0].live -= 1
                if old[0].live == 0:  # a turn the new one extends: nothing finds it any more
                    self._drop(id(old[0]), old[0])
            self._index[key] = (entry, j)
            entry.live += 1
        self._lru[id(entry)] = entry
        self.size_bytes += size
        while self.size_bytes > self.capacity_bytes:
            slot, oldest = next(iter(self._lru.items()))
            self._drop(slot, oldest)
            self.stats.evictions += 1

    def _drop(self, key: int, entry: _Entry) -> None:
        if self._lru.pop(key, None) is None:
            return
        self.size_bytes -= entry.size
        for k in entry.keys:
            if (hit := self._index.get(k)) is not None and hit[0] is entry:
                del self._index[k]


def _chain(text: str, matches: list[tuple[int, str]]) -> list[int]:
    """hashes[j]: a hash of text[:matches[j] start] and of j, chained segment by segment (one pass)."""
    out, h, prev = [], _SEED, 0
    for p, _ in matches:
        h = hash((h, text[prev:p]))
        out.append(h)
        prev = p
    return out


def _map_cuts(ids: list[int], matches: list[tuple[int, str]], token_ids: dict[str, int],
              offset: int) -> list[int] | None:
    """Each match's index in ``ids`` (+ ``offset``), or None when ``ids`` does not hold the added tokens the
    text predicts: the first id not the first match's, or a count of some added token off."""
    out: list[int] = []
    counts: dict[int, int] = {}
    i = -1
    try:
        for _, content in matches:
            tid = token_ids[content]
            i = ids.index(tid, i + 1)
            out.append(i + offset)
            counts[tid] = counts.get(tid, 0) + 1
    except ValueError:
        return None
    if offset and out and out[0] != offset:
        return None
    # Only the markers the text holds are counted: one the text lacks cannot appear, since a raw added token's id
    # comes only from matching its text (never from merges: pre-tokenizers split its punctuation apart).
    if any(ids.count(t) != n for t, n in counts.items()):
        return None
    return out
