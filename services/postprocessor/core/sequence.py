"""One generated sequence: token chunks from a worker in, text deltas and a finish reason out.

Composes the incremental detokenizer, the stop-string matcher and hidden stop token ids, and keeps
the generated ids (what a later migration to another worker re-sends as prompt).

Token accounting follows vLLM and OpenAI: ``completion_tokens`` counts every generated id the worker
sent, including a hidden EOS / stop token whose text is never shown. Ids that arrive in the same
chunk *after* a hidden stop id are discarded and not counted (generation ended at the stop id). When
a stop string matches, every id of the chunk is counted: the worker generated them all, and the
text-to-id boundary inside a chunk is not tracked.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from services.postprocessor.core.detokenizer import IncrementalDetokenizer
from services.postprocessor.core.stop import StopStringMatcher


class FinishReason(enum.IntEnum):
    """Why a sequence ended; values equal ``meshfront.common.v1.FinishReason`` numbers."""

    EOS = 1
    LENGTH = 2
    STOP = 3
    CANCELLED = 4
    ERROR = 5


@dataclass(frozen=True)
class SequenceOptions:
    """What the postprocessor needs to know about one sequence.

    Attributes:
        prompt_ids: the prompt (only its tail is used, as detokenization context).
        stop_strings: strings that end the sequence, matched on text.
        include_stop_str: emit the matched stop string.
        hidden_stop_ids: ids that end the sequence and whose text is never shown (EOS ids).
        min_tokens: no stop condition applies before this many generated ids.
        skip_special_tokens: drop special tokens from the text.
    """

    prompt_ids: Sequence[int] = ()
    stop_strings: tuple[str, ...] = ()
    include_stop_str: bool = False
    hidden_stop_ids: frozenset[int] = frozenset()
    min_tokens: int = 0
    skip_special_tokens: bool = False


@dataclass
class Delta:
    """The outcome of one worker chunk.

    Attributes:
        text: new visible text (may be empty while text is held back).
        tokens: how many of the chunk's ids were consumed (the rest came after a hidden stop id).
        finish: set when the sequence ended with this chunk.
        stop_reason: the stop string that matched, if one did.
    """

    text: str
    tokens: int
    finish: FinishReason | None = None
    stop_reason: str | None = None


@dataclass
class SequenceDecoder:
    """Turns worker chunks into deltas for one sequence.

    Args:
        tokenizer: the model's ``tokenizers.Tokenizer``.
        options: stop and output options of the request.
    """

    tokenizer: Tokenizer
    options: SequenceOptions
    generated_ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    def __post_init__(self) -> None:
        opts = self.options
        self._detok = IncrementalDetokenizer(self.tokenizer, opts.prompt_ids, opts.skip_special_tokens)
        self._stops = StopStringMatcher(opts.stop_strings, opts.include_stop_str)

    def step(self, ids: Sequence[int], worker_finish: FinishReason | None = None) -> Delta:
        """Processes one chunk of generated ids, plus the worker's finish reason if it sent one."""
        if self.finish is not None:
            return Delta("", 0, None)
        # ids[first_checked:] are at or past min_tokens, where stop conditions start to apply.
        first_checked = max(0, self.options.min_tokens - 1 - len(self.generated_ids))
        visible, cut, first_checked = self._split_hidden(ids, first_checked)
        consumed = len(ids) if cut is None else cut + 1
        self.generated_ids.extend(ids[:consumed])
        text, matched = self._text(visible, first_checked)
        if matched is not None:
            return self._finished(Delta(text, consumed, FinishReason.STOP, matched))
        finish = FinishReason.EOS if cut is not None else worker_finish
        if finish is None:
            return Delta(text, consumed)
        tail, matched = self._flush()
        if matched is not None:
            finish = FinishReason.STOP
        return self._finished(Delta(text + tail, consumed, finish, matched))

    def _finished(self, delta: Delta) -> Delta:
        self.finish = delta.finish
        return delta

    def _split_hidden(self, ids: Sequence[int], first_checked: int) -> tuple[Sequence[int], int | None, int]:
        """Finds hidden stop ids in a chunk.

        Returns the ids whose text is shown, the index in ``ids`` of the hidden id that ends the
        sequence (or None), and ``first_checked`` re-indexed into the shown ids. The common case (no
        hidden id in the chunk) is one C-level ``isdisjoint`` scan.
        """
        hidden = self.options.hidden_stop_ids
        if not hidden or hidden.isdisjoint(ids):
            return ids, None, first_checked
        cut = next((i for i in range(first_checked, len(ids)) if ids[i] in hidden), None)
        end = len(ids) if cut is None else cut
        split = min(first_checked, end)
        # Before min_tokens a hidden id does not end the sequence, but it is still never shown.
        early = [i for i in ids[:split] if i not in hidden]
        return early + list(ids[split:end]), cut, len(early) + (first_checked - split)

    def _text(self, ids: Sequence[int], first_checked: int) -> tuple[str, str | None]:
        """Detokenizes ``ids`` and runs the stop matcher (checks from ``first_checked`` on)."""
        if not self._stops.active:
            return self._detok.push(ids), None
        if 0 < first_checked < len(ids):  # the one chunk that crosses min_tokens: split it there
            before = self._stops.feed(self._detok.push(ids[:first_checked]), check=False)
            after = self._stops.feed(self._detok.push(ids[first_checked:]), check=True)
            return before.text + after.text, after.matched
        result = self._stops.feed(self._detok.push(ids), check=first_checked < len(ids))
        return result.text, result.matched

    def _flush(self) -> tuple[str, str | None]:
        """End of stream: the last pending text, then whatever the stop matcher held back."""
        tail = self._detok.flush()
        if not self._stops.active:
            return tail, None
        past_min = len(self.generated_ids) >= self.options.min_tokens
        result = self._stops.feed(tail, check=past_min)
        if result.matched is not None:
            return result.text, result.matched
        return result.text + self._stops.flush(), None
