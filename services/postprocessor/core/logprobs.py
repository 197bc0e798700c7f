"""Token ids as the strings a logprobs response shows.

OpenAI and vLLM show each token as its own decoded text (``" hello"``, not the byte-level BPE form
``"Ġhello"``); a token holding part of a multi-byte character decodes to U+FFFD. Special tokens keep
their text (``<|im_end|>``) whatever ``skip_special_tokens`` says, so every position has a token.
Decoded strings are memoised per tokenizer: vocabularies are bounded and a response repeats ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer


class TokenTexts:
    """Memoised id -> token text for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        """The text of one token."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def texts(self, token_ids: Iterable[int]) -> list[str]:
        """The texts of several tokens, in order."""
        return [self.text(i) for i in token_ids]
