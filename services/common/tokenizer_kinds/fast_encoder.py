"""``--tokenizer fastokens``: fastokens (a Rust BPE encoder on PyPI) encodes prompts; ``tokenizers`` still does
everything else (decoding, vocabulary, the byte and length bounds read from its model).

fastokens reads the same ``tokenizer.json`` document (here the loaded tokenizer's own, whatever format it
came from). A model it cannot load, or one whose probe text it encodes differently from ``tokenizers``, is
a load failure: the caller falls back to ``tokenizers`` unless ``--no-tokenizer-fallback``
(services/common/tokenizer_files.py). Dynamo's frontend has the same two backends and the same fallback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer

# Text that crosses the usual pattern branches (contractions, digits, CJK, emoji, whitespace runs, code).
PROBE = ("Hello, world! It's 2026-12-06; naïve café 東京 🤖🎉\n\n\tdef f(x):\n        return x ** 2  # ok\r\n"
         "   trailing   ")


class Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...


class Encoder(Protocol):
    """What the preprocessor encodes prompts with: ``tokenizers.Tokenizer`` or ``fastokens.Tokenizer``."""

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> Encoding: ...

    def encode_batch(self, texts: list[str], /, *, add_special_tokens: bool = ...) -> Sequence[Encoding]: ...


class FastEncoderError(RuntimeError):
    """fastokens cannot load this tokenizer, or encodes it differently from ``tokenizers``."""


def fastokens_encoder(tokenizer: Tokenizer) -> Encoder:
    """A fastokens tokenizer over ``tokenizer``'s document, checked on ``PROBE`` against it.

    Raises:
        FastEncoderError: fastokens is not installed, rejects the document, or disagrees on the probe."""
    try:
        import fastokens
    except ImportError as e:
        raise FastEncoderError("fastokens is not installed") from e
    try:
        fast = fastokens.Tokenizer.from_json_str(tokenizer.to_str())
        ids = fast.encode(PROBE, add_special_tokens=False).ids
    except Exception as e:  # fastokens raises plain exceptions for documents it does not support
        raise FastEncoderError(f"fastokens cannot load it ({type(e).__name__}: {e})") from e
    expected = tokenizer.encode(PROBE, add_special_tokens=False).ids
    if list(ids) != expected:
        raise FastEncoderError("fastokens encodes the probe text differently from tokenizers")
    return fast
