"""Output shapes forced by guided decoding for ``tool_choice`` ``required`` and a named function.

With ``required`` the worker is constrained to a JSON array ``[{"name": ..., "parameters": {...}}, ...]``;
with a named function, to that function's arguments object. Whatever the model's own tool format,
these are what the constrained output looks like (as in vLLM), so they have their own parsers.
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, skip_ws
from services.postprocessor.core.parsers.tool_calls.json_sequence import JsonCallSequence
from services.postprocessor.core.parsers.types import TextParser, new_call_id


class RequiredToolParser(TextParser):
    """A JSON array of call objects; anything else is content."""

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "start"
        self._text = AfterCallText(self.out)
        self._seq: JsonCallSequence | None = None

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if self._state == "start":
            p = skip_ws(buf, pos)
            if p == len(buf):
                return False
            if buf[p] == "[":
                self._seq = JsonCallSequence(self.out, self._text, separators=",", bracketed=True)
                self._state, self._pos = "list", p + 1
            else:
                self._state = "content"
            return True
        if self._state == "content":
            self._text.content(buf[pos:])
            self._pos = len(buf)
            return False
        seq = self._seq
        assert seq is not None
        self._pos = seq.consume(buf, pos, final)
        if not seq.done:
            return False
        if seq.broken and not seq.started:
            self._text.content("[" + "".join(seq.raw))
        self._state = "content"
        return True

    def _end(self) -> None:
        if self._state == "start":
            self._text.content(self._buf[self._pos:])
        elif self._state == "list" and self._seq is not None and not self._seq.started:
            self._text.content("[" + "".join(self._seq.raw))
        self._text.call_starts()


class NamedToolParser(TextParser):
    """The whole output is the named function's arguments (leading whitespace dropped)."""

    def __init__(self, name: str, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._name = name
        self._started = False

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if not self._started:
            pos = skip_ws(buf, pos)
            self._pos = pos
            if pos == len(buf):
                return False
            self._started = True
            self.out.start_call(self._name)
        self.out.arguments(buf[pos:])
        self._pos = len(buf)
        return False
