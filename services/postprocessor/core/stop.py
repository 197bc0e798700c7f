"""Stop strings matched on streamed text, with hold-back so no part of a stop string leaks.

Dynamo emits text while a stop string is only partly matched, so ``"Hello ##"`` can reach the client
before ``"##END"`` matches (dynamo-frontend.md §4.2, quirk). Here the longest suffix of the text seen
so far that is a proper prefix of some stop string is held back until the next text shows whether it
becomes a match; it is released at the end of the stream.

Matching is chunk-invariant: the stop string that *completes first* in the text wins (ties go to
the one that starts first), which is what a token-by-token engine would see, whatever way the text
was split into chunks. Work per call is proportional to the new text plus the held-back tail (at
most the longest stop string), never to the whole output.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """What ``StopStringMatcher.feed`` lets through.

    Attributes:
        text: text that is safe to emit now.
        matched: the stop string that ended the sequence, or None.
    """

    text: str
    matched: str | None = None


class StopStringMatcher:
    """Finds the first stop string in a text stream and holds back possible partial matches.

    Args:
        stop_strings: the strings that end generation; empty strings are ignored.
        include_stop_str: emit the matched stop string (vLLM ``include_stop_str_in_output``);
            otherwise the text ends right before it.
    """

    def __init__(self, stop_strings: Iterable[str], include_stop_str: bool = False):
        self._stops = tuple(dict.fromkeys(s for s in stop_strings if s))
        self._include = include_stop_str
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._first_chars = frozenset(s[0] for s in self._stops)
        self._held = ""
        self._done = False

    @property
    def active(self) -> bool:
        """False when there is nothing to match, so callers can skip the matcher entirely."""
        return bool(self._stops)

    def feed(self, text: str, check: bool = True) -> StopResult:
        """Adds text; returns what can be emitted and the stop string if one completed.

        Args:
            text: new text.
            check: whether a stop string may complete inside this text. False while ``min_tokens``
                is not reached: the text still passes through the hold-back, so a stop string that
                starts before the threshold and completes after it is still found.
        """
        if self._done:
            return StopResult("")
        buffer = self._held + text
        if check:
            match = self._first_match(buffer, len(self._held))
            if match is not None:
                start, stop = match
                self._done = True
                self._held = ""
                end = start + len(stop) if self._include else start
                return StopResult(buffer[:end], stop)
        hold = self._partial_suffix_len(buffer)
        self._held = buffer[len(buffer) - hold:] if hold else ""
        return StopResult(buffer[:len(buffer) - hold])

    def flush(self) -> str:
        """Releases the held-back text at the end of the stream (it turned out not to be a stop)."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str, old_len: int) -> tuple[int, str] | None:
        """(start, stop) of the match that ends first and ends inside the new text, if any.

        ``buffer[:old_len]`` is the held tail, which holds no complete match that ends inside it
        (or one that was not allowed to count), so each search starts where a match would end
        after ``old_len``.
        """
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop, max(0, old_len - len(stop) + 1))
            if start < 0:
                continue
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _partial_suffix_len(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of some stop string.

        Only positions holding the first character of some stop string can start one, so the
        common case (none of those characters in the last few characters) costs a few ``find`` calls.
        """
        tail = buffer[-self._max_hold:] if self._max_hold else ""
        for start, char in enumerate(tail):
            if char in self._first_chars:
                candidate = tail[start:]
                if any(len(stop) > len(candidate) and stop.startswith(candidate) for stop in self._stops):
                    return len(candidate)
        return 0
