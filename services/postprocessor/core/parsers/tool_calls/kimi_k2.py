"""Kimi K2 / K2.5 tool calls: a section of calls whose ids carry the function name::

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_calls_section_end|>

The call id is ``functions.NAME:INDEX`` (some checkpoints drop the ``functions.`` prefix, and the
section markers also occur in the singular, ``<|tool_call_section_begin|>``); the name is what lies
between. The arguments are JSON, streamed verbatim as they are scanned. A block that breaks before
the name is known is shown as plain text.

Call ids are Kimi's ``functions.NAME:N``, with N counted on from the tool calls already in the request's
history (``history_tool_calls``), as SGLang, vLLM and Dynamo make them for Kimi models: the chat template
renders earlier calls by these ids, so the model's next turn sees one sequence. The index the model wrote
itself is not trusted (a checkpoint may restart it at 0).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, ArgumentStream, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.tool_calls.call_block import CallBlock
from services.postprocessor.core.parsers.types import Emitter, TextParser, new_call_id

SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_CALL_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$", re.DOTALL)


class KimiCallIds:
    """Kimi's call ids: ``{id_prefix}NAME:N``, N = the history's tool calls + the call's index in this reply."""

    id_prefix = "functions."
    out: Emitter

    def count_calls_from(self, history_tool_calls: int) -> None:
        prefix = self.id_prefix
        self.out.call_id = lambda name, index: f"{prefix}{name}:{history_tool_calls + index}"


class KimiK2ToolParser(KimiCallIds, TextParser):
    """``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:i<|tool_call_argument_begin|>{…}`` (kimi_k2)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id, history_tool_calls: int = 0):
        super().__init__(new_id)
        self.count_calls_from(history_tool_calls)
        self._state = "content"
        self._text = AfterCallText(self.out)
        self._block = CallBlock(self._text)
        self._header: list[str] = []
        self._arguments = ArgumentStream()

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            end, marker = find_marker(buf, pos, SECTION_BEGINS, final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._block.open(marker)
            self._pos = end + len(marker)
            self._state = "between"
            return True
        if state == "header":
            end, marker = find_marker(buf, pos, (ARGUMENT_BEGIN, CALL_END, *SECTION_ENDS), final)
            self._header.append(buf[pos:end])
            if marker != ARGUMENT_BEGIN:
                self._record(buf[pos:end])
                self._pos = end
                if marker is not None:  # a call without arguments: no name to trust, shown as text
                    self._state = "between"
                return marker is not None
            self._record(buf[pos:end + len(marker)])
            self._pos = end + len(marker)
            return self._start_call("".join(self._header).strip())
        if state == "args":
            self._pos, done = self._arguments.step(self.out, buf, pos, final)
            if done:
                self._state = "call_end"
            return done
        p = skip_ws(buf, pos)
        if state == "call_end":
            verdict = expect(buf, p, CALL_END, final)
            if verdict == "wait" or (p == len(buf) and not final):
                return False
            self._pos = p + len(CALL_END) if verdict == "yes" else pos
            self._state = "between"
            return True
        return self._between_calls(buf, p, final)

    def _between_calls(self, buf: str, p: int, final: bool) -> bool:
        for marker in (CALL_BEGIN, *SECTION_ENDS):
            verdict = expect(buf, p, marker, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._record(buf[self._pos:p + len(marker)])
                self._pos = p + len(marker)
                if marker == CALL_BEGIN:
                    self._state, self._header = "header", []
                else:
                    self._close_section()
                return True
        if p == len(buf) and not final:
            return False
        self._close_section()  # anything else ends the section; it is content again
        return p < len(buf)

    def _start_call(self, call_id: str) -> bool:
        match = _CALL_ID.match(call_id)
        name = match.group(1).strip() if match else ""
        if not name:
            self._show_raw()
            return True
        self.out.start_call(name)
        self._block.call_started()
        self._arguments.reset()
        self._state = "args"
        return True

    def _record(self, text: str) -> None:
        self._block.record(text)

    def _show_raw(self) -> None:
        self._block.show_raw()
        self._state = "content"

    def _close_section(self) -> None:
        self._block.close()
        self._state = "content"

    def _end(self) -> None:
        if self._state in ("between", "header"):
            self._show_raw()
        self._text.call_starts()
