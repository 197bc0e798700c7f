"""Llama 3.x JSON tool calls: ``<|python_tag|>{"name": ..., "parameters": {...}}`` or a bare object.

Llama 3.1/3.2/3.3 with the JSON tool prompt answer a call with a JSON object, either after
``<|python_tag|>`` or as the whole reply; several calls are separated by ``;``. A reply that starts
with ``{`` is a call only if its first key is ``"name"`` (decided as soon as that key is readable),
so a plain JSON answer stays content. The tag may also follow some text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.tool_calls.json_sequence import JsonCallSequence
from services.postprocessor.core.parsers.types import TextParser, new_call_id

PYTHON_TAG = "<|python_tag|>"
_CALL_OBJECT = re.compile(r'\{\s*"name"\s*:')
_CALL_OBJECT_PREFIX = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?\Z')


class Llama3JsonToolParser(TextParser):
    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "start"
        self._text = AfterCallText(self.out)
        self._seq: JsonCallSequence | None = None
        self._tag = ""

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if self._state == "start":
            return self._start(buf, pos, final)
        if self._state == "content":
            end, marker = find_marker(buf, pos, (PYTHON_TAG,), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._open(end + len(marker), marker)
            return True
        seq = self._seq
        assert seq is not None
        self._pos = seq.consume(buf, pos, final)
        if not seq.done:
            return False
        if not seq.started:  # not a call after all: show it as it came
            self._text.content(self._tag + "".join(seq.raw))
        self._seq = None
        self._state = "content"
        return True

    def _start(self, buf: str, pos: int, final: bool) -> bool:
        p = skip_ws(buf, pos)
        if p == len(buf) and not final:
            return False
        verdict = expect(buf, p, PYTHON_TAG, final)
        if verdict == "wait":
            return False
        if verdict == "yes":
            self._open(p + len(PYTHON_TAG), PYTHON_TAG)
            return True
        if _CALL_OBJECT.match(buf, p):
            self._open(p, "")
            return True
        if not final and _CALL_OBJECT_PREFIX.match(buf, p):
            return False
        self._state = "content"
        return True

    def _open(self, pos: int, tag: str) -> None:
        self._state = "calls"
        self._tag = tag
        self._seq = JsonCallSequence(self.out, self._text, separators=";,", bracketed=False)
        self._pos = pos

    def _end(self) -> None:
        if self._seq is not None and not self._seq.started:
            self._text.content(self._tag + "".join(self._seq.raw))
        self._text.call_starts()
