"""Inkling tool calls: ``<|content_invoke_tool_json|>{"name": "f", "args": {…}}<|end_message|>`` (name: inkling).

Inkling writes each call as its own block (grammar: ``core/parsers/inkling_blocks.py``) holding one
JSON object whose arguments are under ``args`` (``arguments`` and ``parameters`` are read too); the
arguments are forwarded verbatim as they stream. Visible blocks are content; the block markers, and
a header's function name, are not. Without the reasoning parser a thinking block's text is content,
as with every format. A call object that breaks before its name is shown as plain text, marker and
the rest of its block included; what follows a call that broke after its name, up to its block's end,
is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.inkling_blocks import BLOCK_ENDS, CONTENT_TOOL_JSON, MARKERS, MESSAGE_MODEL
from services.postprocessor.core.parsers.scan import AfterCallText, JsonCallReader, find_marker
from services.postprocessor.core.parsers.types import TextParser, new_call_id


class _ArgsCallReader(JsonCallReader):
    """A call object whose arguments may be under ``args``: read as ``arguments`` is."""

    def _start_value(self, buf: str, pos: int) -> int:
        if self._key == "args":
            self._key = "arguments"
        return super()._start_value(buf, pos)


class InklingToolParser(TextParser):
    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "header"
        self._seen_marker = False  # header text before any marker at all is a plain answer
        self._text = AfterCallText(self.out)
        self._reader: JsonCallReader | None = None
        self._raw: list[str] = []

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "call":
            return self._call(buf, pos, final)
        markers = BLOCK_ENDS if state == "skip" else MARKERS
        end, marker = find_marker(buf, pos, markers, final)
        if state == "text" or (state == "header" and not self._seen_marker):
            self._text.content(buf[pos:end])
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        self._seen_marker = True
        if state == "skip" or marker in BLOCK_ENDS:
            self._state = "text"
        elif marker == MESSAGE_MODEL:
            self._state = "header"
        elif marker == CONTENT_TOOL_JSON:
            self._open_call(marker)
        else:
            self._state = "text"
        return True

    def _open_call(self, marker: str) -> None:
        self._text.call_starts()
        self._reader = _ArgsCallReader(self.out)
        self._raw, self._state = [marker], "call"

    def _call(self, buf: str, pos: int, final: bool) -> bool:
        reader = self._reader
        assert reader is not None
        new = reader.consume(buf, pos, final)
        if not reader.started:
            self._raw.append(buf[pos:new])
        self._pos = new
        if not (reader.done or reader.error):
            if final:  # cut off inside the object
                self._close_call()
                self._state = "text"
            return False
        # A broken object before its name: the rest of the block is shown with it, as the text it was.
        self._state = "skip" if reader.started else "text"
        self._close_call()
        return True

    def _close_call(self) -> None:
        reader = self._reader
        assert reader is not None
        if reader.started:
            self._text.after_call()
        else:
            self._text.content("".join(self._raw))
        self._reader, self._raw = None, []

    def _end(self) -> None:
        self._text.call_starts()  # whitespace after the last call is dropped
