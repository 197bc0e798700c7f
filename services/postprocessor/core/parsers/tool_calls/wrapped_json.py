"""JSON call objects after a start marker, as one object or a ``[…]`` list, up to an optional end marker.

The mechanism of the formats that wrap ``{"name": …, "arguments": {…}}`` objects in a marker pair
(``nemotron_deci``'s ``<TOOLCALL>[…]</TOOLCALL>``, ``jamba``'s ``<tool_calls>[…]</tool_calls>``) or
put a marker in front of them (``phi4``'s ``functools[…]``), and Dynamo's ``default``, which takes
both and a bare reply. Each format is a subclass in its own module naming its markers.

Text before the marker is content; after the block, text is content again (whitespace between
blocks is dropped). A block that breaks before a call's name is known is shown as the plain text it
was, marker included; one that breaks after a call started keeps what was streamed.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.tool_calls.json_sequence import JsonCallSequence
from services.postprocessor.core.parsers.types import TextParser, new_call_id

# A reply that opens with a call object (``{"name"``) or a list of them; decided once ``"name"`` is readable.
_CALL_START = re.compile(r'\[?\s*\{\s*"name"\s*:')
_CALL_START_PREFIX = re.compile(r'\[?\s*(?:\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?)?\Z')


class WrappedJsonToolParser(TextParser):
    """Calls after one of ``start_tags``; ``end_tag`` ("" for none) closes the block when present.

    ``bare_reply``: a reply that itself opens with a call object or a list of them is calls too.
    """

    start_tags: tuple[str, ...] = ()
    end_tag = ""
    bare_reply = False

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "start" if self.bare_reply else "content"
        self._text = AfterCallText(self.out)
        self._seq: JsonCallSequence | None = None
        self._opening = ""  # the marker (and "[") that opened the block, shown if it breaks early

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one branch per state
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "start":
            return self._start(buf, pos, final)
        if state == "content":
            end, marker = find_marker(buf, pos, self.start_tags, final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._opening, self._state, self._pos = marker, "open", end + len(marker)
            return True
        if state == "open":
            return self._open(buf, pos, final)
        if state == "calls":
            return self._calls(buf, pos, final)
        if state == "skip":
            end, marker = find_marker(buf, pos, (self.end_tag,), final)
            self._pos = end + len(marker or "")
            if marker is None:
                return False
            self._state = "content"
            self._text.after_call()
            return True
        # "close": the end marker, if the format has one and it is there.
        p = skip_ws(buf, pos)
        verdict = expect(buf, p, self.end_tag, final) if self.end_tag else "no"
        if verdict == "wait" or (self.end_tag and p == len(buf) and not final):
            return False
        if verdict == "yes":
            self._pos = p + len(self.end_tag)
        self._state = "content"
        return True

    def _start(self, buf: str, pos: int, final: bool) -> bool:
        p = skip_ws(buf, pos)
        if p == len(buf) and not final:
            return False
        if _CALL_START.match(buf, p):
            self._opening, self._state, self._pos = "", "open", p
            return True
        if not final and _CALL_START_PREFIX.match(buf, p):
            return False
        self._state = "content"
        return True

    def _open(self, buf: str, pos: int, final: bool) -> bool:
        p = skip_ws(buf, pos)
        if p == len(buf) and not final:
            return False
        c = buf[p] if p < len(buf) else ""
        if c not in "[{" or not c:  # not a call after all: the marker is text
            self._text.content(self._opening)
            self._state = "content"
            return True
        bracketed = c == "["
        self._opening += buf[pos:p + 1] if bracketed else buf[pos:p]
        self._text.call_starts()
        self._seq = JsonCallSequence(self.out, self._text, separators=",;", bracketed=bracketed)
        self._state, self._pos = "calls", p + 1 if bracketed else p
        return True

    def _calls(self, buf: str, pos: int, final: bool) -> bool:
        seq = self._seq
        assert seq is not None
        self._pos = seq.consume(buf, pos, final)
        if not seq.done:
            return False
        broken_call = seq.broken and seq.started
        self._close_seq()
        # A call that broke mid-block: the rest of the block up to the end marker is dropped with it.
        self._state = "skip" if broken_call and self.end_tag else "close"
        return True

    def _close_seq(self) -> None:
        seq = self._seq
        assert seq is not None
        if not seq.started:  # no call started: show the block as it came
            self._text.content(self._opening + "".join(seq.raw))
        self._seq = None

    def _end(self) -> None:
        if self._seq is not None:
            self._close_seq()
        self._text.call_starts()  # whitespace after the last call is dropped
