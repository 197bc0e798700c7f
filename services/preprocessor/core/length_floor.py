"""A floor on the tokens a text encodes to, found without encoding all of it, so a prompt or embeddings
input far too long is refused in moments (a 10 MB input took 16-30 s to tokenize and refuse).

Two sound floors, each for the tokenizers it holds for:

- bytes (byte_bound.py): byte-level BPE and BPE with byte fallback, where a token stands for a bounded
  number of bytes;
- pieces between spaces, for tokenizers that never make a token across a space (WordPiece/BERT, which
  have no byte floor: they drop whitespace and turn an over-long word into one ``[UNK]``). Their
  normaliser works character by character (a space composes with nothing and ends every case
  context), their pre-tokenizer splits at whitespace and drops it, and no added token holds a space.
  So a text's tokens are its space-separated chunks' tokens in order, and a long text is encoded a
  chunk at a time only until the count passes the limit. ``BertPreTokenizer`` also makes every ASCII
  punctuation character a word of its own, which bounds a text with no spaces to split at.
"""

from __future__ import annotations

import string
from typing import Any

import orjson
from tokenizers import Tokenizer

from services.preprocessor.core import byte_bound

_CHARWISE_NORMALIZERS = frozenset({"BertNormalizer", "Lowercase", "StripAccents", "NFC", "NFD", "NFKC", "NFKD"})
_SPACE_SPLITTERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
# Characters per encode call while counting: large enough that the per-call cost vanishes, small enough
# that a too-long input is refused after one or two calls.
CHUNK_CHARS = 65_536


def _charwise(normalizer: dict[str, Any] | None) -> bool:
    if normalizer is None:
        return True
    if normalizer.get("type") == "Sequence":
        return all(_charwise(n) for n in normalizer.get("normalizers", []))
    return normalizer.get("type") in _CHARWISE_NORMALIZERS


def space_split_kind(tokenizer: Tokenizer) -> str | None:
    """The pre-tokenizer's type when ``tokenizer`` never makes a token across a space; None otherwise."""
    pre = tokenizer.pre_tokenizer
    kind = orjson.loads(pre.__getstate__()).get("type") if pre is not None else None
    normalizer = orjson.loads(tokenizer.normalizer.__getstate__()) if tokenizer.normalizer is not None else None
    added = tokenizer.get_added_tokens_decoder().values()
    if (kind not in _SPACE_SPLITTERS or not _charwise(normalizer) or tokenizer.truncation is not None
            or any(" " in t.content or t.lstrip or t.rstrip for t in added)):
        return None
    return kind


def tokens_up_to(tokenizer: Tokenizer, text: str, limit: int, chunk_chars: int = CHUNK_CHARS) -> int:
    """The tokens of ``text`` (no special tokens) for a tokenizer that splits at spaces, counted a chunk at a
    time: exact when at most ``limit``; once past it, counting stops (the count is then a floor)."""
    count, start = 0, 0
    while start < len(text) and count <= limit:
        end = text.find(" ", start + chunk_chars)
        end = len(text) if end < 0 else end
        count += len(tokenizer.encode(text[start:end], add_special_tokens=False).ids)
        start = end + 1  # the space itself is no token
    return count


def fewest_tokens(text: str, limit: int, *, ceiling: float | None, split_kind: str | None,
                  tokenizer: Tokenizer) -> int:
    """A floor on the tokens ``text`` encodes to, which may stop counting once past ``limit``; 0 when the
    tokenizer admits neither floor."""
    floor = byte_bound.fewest_tokens(text, ceiling)
    if floor > limit or split_kind is None:
        return floor
    if split_kind == "BertPreTokenizer":
        floor = max(floor, sum(text.count(p) for p in string.punctuation))  # each its own word
        if floor > limit:
            return floor
    return max(floor, tokens_up_to(tokenizer, text, limit))
