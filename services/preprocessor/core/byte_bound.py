"""A sound floor on a prompt's token count from its byte length, so a prompt far too long for the
context window is refused before the tokenizer spends seconds on it.

Every token stands for at most ``L`` bytes of what the tokenizer's model sees: ``L`` is the longest
vocabulary entry or added token. If the pipeline before the model never drops input and shrinks it
at most ``s``-fold (Unicode normalisation turns at most ``s`` bytes into one), a text of ``B`` bytes
needs at least ``B / (s * L)`` tokens. ``bytes_per_token_ceiling`` is that ``s * L``, or None when the
pipeline can make input vanish and no byte count bounds the tokens:

- WordPiece (BERT) drops whitespace and turns a whole over-long word into one ``[UNK]``; Unigram and
  BPE without byte fallback can fuse a run of unknown characters into one token; ``Strip``,
  ``StripAccents``, ``Precompiled``, ``BertNormalizer`` and a ``Replace`` with nothing delete text;
  ``Whitespace``-style pre-tokenizers and ``Removed`` splits drop what they split on; an added token
  with ``lstrip``/``rstrip`` absorbs any run of whitespace; truncation caps the count.
- Byte-level BPE (GPT-2, Qwen, Llama 3) covers every byte when its vocabulary holds the 256 byte
  symbols, and BPE with ``byte_fallback`` (Llama 2, Mistral) turns any unknown character into bytes.

Nothing here is an estimate: a bound that is too loose only lets the tokenizer decide, one that is
too tight would refuse a prompt that fits, so every factor is an upper bound (tests/unit/preprocessor/
test_byte_bound.py recomputes the Unicode ones from the character database).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from tokenizers import Tokenizer, models

# How many bytes of input one byte of output can stand for, at most, per Unicode normalisation form.
# Computed over every code point and every canonically equivalent spelling of each composed
# character (the test does it again): NFC 3.5 (U+0390 from 7 bytes), NFKC 4 (U+1D7CE "0" from 4
# bytes). Rounded up, so a Unicode version between Python's and the tokenizer's cannot cross them.
UNICODE_SHRINK = {"NFC": 4.0, "NFD": 4.0, "NFKC": 5.0, "NFKD": 5.0}
# Lowercase maps every character to at least one character: at most 4 bytes become 1. Prepend and
# ByteLevel only add.
_FIXED_SHRINK = {**UNICODE_SHRINK, "Lowercase": 4.0, "Prepend": 1.0, "ByteLevel": 1.0}
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Metaspace", "Digits", "Punctuation", "UnicodeScripts"})
# The 256 symbols byte-level BPE writes bytes as (GPT-2's bytes_to_unicode).
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
BYTE_SYMBOLS = frozenset(
    [chr(b) for b in _PRINTABLE] + [chr(256 + n) for n in range(256 - len(_PRINTABLE))])
# The tokens BPE with byte_fallback spells an unknown character's bytes with.
_FALLBACK_BYTES = frozenset(f"<0x{b:02X}>" for b in range(256))


def _replace_shrink(normalizer: dict[str, Any]) -> float | None:
    """A ``Replace`` of a literal by a non-empty literal shrinks by their length ratio; a regex or "" is unbounded."""
    pattern, content = normalizer.get("pattern", {}).get("String"), normalizer.get("content")
    if isinstance(pattern, str) and pattern and isinstance(content, str) and content:
        return max(1.0, len(pattern.encode()) / len(content.encode()))
    return None


def _shrink(normalizer: dict[str, Any] | None) -> float | None:
    """The most bytes of input one byte of the normaliser's output stands for; None if it deletes text
    (Strip, StripAccents, BertNormalizer, Precompiled, Nmt) or is unknown."""
    if normalizer is None:
        return 1.0
    kind = str(normalizer.get("type"))
    if kind == "Sequence":
        factors = [_shrink(step) for step in normalizer.get("normalizers", [])]
        return None if None in factors else math.prod(f for f in factors if f is not None)
    if kind == "Replace":
        return _replace_shrink(normalizer)
    return _FIXED_SHRINK.get(kind)


def _keeps_everything(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_everything(p) for p in pre_tokenizer.get("pretokenizers", []))
    return kind in _KEEPING_PRE_TOKENIZERS and pre_tokenizer.get("behavior") != "Removed"


def _has_byte_level(node: Any) -> bool:
    if not isinstance(node, dict):
        return False
    return node.get("type") == "ByteLevel" or any(
        _has_byte_level(n) for key in ("pretokenizers", "normalizers") for n in node.get(key, []))


def _state(component: Any) -> dict[str, Any] | None:
    """A pipeline component's serialised form (None when the tokenizer has none)."""
    return None if component is None else orjson.loads(component.__getstate__())


def bytes_per_token_ceiling(tokenizer: Tokenizer) -> float | None:
    """The most UTF-8 bytes of a text one token of ``tokenizer`` can stand for, or None if there is no such
    bound (see the module docstring). Run once per model (a few tenths of a second for a 150k vocabulary)."""
    model = tokenizer.model
    if tokenizer.truncation is not None or not isinstance(model, models.BPE):
        return None
    added = tokenizer.get_added_tokens_decoder().values()
    if any(t.lstrip or t.rstrip for t in added):
        return None
    normalizer, pre_tokenizer = _state(tokenizer.normalizer), _state(tokenizer.pre_tokenizer)
    shrink = _shrink(normalizer)
    if shrink is None or not _keeps_everything(pre_tokenizer):
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    if _has_byte_level(pre_tokenizer) or _has_byte_level(normalizer):
        if not vocab.keys() >= BYTE_SYMBOLS:
            return None  # a byte without a symbol is skipped (BPE without unk) or fused into one unk
        longest = max(len(token) for token in vocab)  # one symbol per byte
    elif model.byte_fallback and vocab.keys() >= _FALLBACK_BYTES:  # without them, an unknown character is unk
        longest = max(len(token.encode()) for token in vocab)  # a "<0x41>" entry (6) stands for 1 byte
    else:
        return None
    return shrink * max([longest, *(len(t.content.encode()) for t in added)])


def fewest_tokens(text: str, ceiling: float | None) -> int:
    """A lower bound on the tokens ``text`` encodes to (NULs, which encoding removes, not counted); 0 without
    a ceiling."""
    if ceiling is None:
        return 0
    size = len(text.encode("utf-8", "surrogatepass")) - text.count("\0")
    return int(size // ceiling)
