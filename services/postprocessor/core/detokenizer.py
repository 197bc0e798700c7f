"""Incremental detokenization: token ids in, only complete text out.

Byte-level BPE vocabularies (Qwen, Llama 3, GPT) split one character (an emoji, a CJK glyph) into
several tokens that each hold a few of its UTF-8 bytes; decoding a partial sequence yields U+FFFD.
SentencePiece-style decoders also change a token's text depending on what precedes it (the leading
space of the first token is dropped). Both are handled the TGI / vLLM / Dynamo way: keep a small
window of ids, decode ``window[prefix:read]`` (text already emitted) and ``window[prefix:]`` (text
with the new ids), and emit the difference only when it does not end in an incomplete character.
The window starts with the last few prompt ids so the first generated token decodes in context.

Work is per chunk, not per token: a chunk of N new ids costs two ``decode`` calls over the window
(plus at most a few more when the chunk ends inside a character), so a worker message holding many
tokens is turned into text by Rust in one go.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

# How many prompt ids seed the window (TGI and Dynamo use 5).
PROMPT_CONTEXT_IDS = 5
# A UTF-8 character has at most 4 bytes, so at most 3 trailing ids (each holding at least one byte)
# can belong to an unfinished character; a little slack covers ids that decode to nothing.
_MAX_INCOMPLETE_TAIL_IDS = 6
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (Rust backed).
        prompt_ids: the prompt; only its last ``PROMPT_CONTEXT_IDS`` ids are kept as context.
        skip_special_tokens: drop special tokens from the text (OpenAI default in vLLM is true; ours is
            false because reasoning and tool-call parsers need markers such as ``<think>``).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._window: list[int] = list(prompt_ids[-PROMPT_CONTEXT_IDS:])
        # window[:prefix] is dropped on the next trim; window[prefix:read] is context whose text was
        # already emitted; window[read:] are ids whose text is still pending.
        self._prefix = 0
        self._read = len(self._window)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def push(self, ids: Sequence[int]) -> str:
        """Adds generated ids and returns the text that became complete (possibly empty)."""
        if not ids:
            return ""
        window = self._window
        window.extend(ids)
        emitted = self._decode(window[self._prefix:self._read])
        end = len(window)
        text = self._decode(window[self._prefix:])
        # Rare: the chunk ends inside a character. Retreat id by id until the text is complete, so
        # the complete part of a long chunk is not held back with it.
        retreat = 0
        while text.endswith(REPLACEMENT_CHAR) and end > self._read and retreat < _MAX_INCOMPLETE_TAIL_IDS:
            end -= 1
            retreat += 1
            text = self._decode(window[self._prefix:end])
        if end <= self._read or len(text) <= len(emitted) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self._advance(end)
        return text[len(emitted):]

    def flush(self) -> str:
        """Returns whatever text is still pending at the end of the stream.

        A sequence cut inside a character (max_tokens reached) ends in U+FFFD, exactly as a full
        decode of the output would; dropping it would make streamed text differ from the full decode.
        """
        if self._read >= len(self._window):
            return ""
        emitted = self._decode(self._window[self._prefix:self._read])
        text = self._decode(self._window[self._prefix:])
        self._advance(len(self._window))
        return text[len(emitted):] if len(text) > len(emitted) else ""

    def _advance(self, end: int) -> None:
        """Moves the offsets past emitted text and trims the window to what the next decode needs."""
        drop = self._read
        self._window = self._window[drop:]
        self._prefix = 0
        self._read = end - drop
