"""Kimi K3 tool calls, in its XTML channels (every ``<|open|>``, ``<|close|>``, ``<|sep|>`` is one token)::

    <|open|>response<|sep|>Let me check.<|close|>response<|sep|>
    <|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|>
    <|close|>tools<|sep|>
    <|close|>message<|sep|>

The reply is the ``response`` channel: its wrappers and the message's end are markup, never content.
Each argument says its own type: ``type="string"`` (or no type) keeps the text exactly, any other
type is JSON (text that is not JSON stays a string). Attribute values undo the template's ``&quot;``
/ ``&amp;`` escaping. The ``think`` channel is the reasoning parser's (``reasoning/kimi_k3.py``).

Call ids are ``NAME:N``, N counted on from the history's tool calls: SGLang's ids for K3 (its
``_process_tool_call_id``), which drop K2's ``functions.`` prefix, as K3's ``call`` header has no id of its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import find_marker
from services.postprocessor.core.parsers.tool_calls.kimi_k2 import KimiCallIds
from services.postprocessor.core.parsers.tool_calls.param_types import ToolSchemas
from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser
from services.postprocessor.core.parsers.types import ParsedDelta, concat, new_call_id

THINK_OPEN = "<|open|>think<|sep|>"
THINK_CLOSE = "<|close|>think<|sep|>"
RESPONSE_OPEN = "<|open|>response<|sep|>"
RESPONSE_CLOSE = "<|close|>response<|sep|>"
TOOLS_OPEN = "<|open|>tools<|sep|>"
MESSAGE_CLOSE = "<|close|>message<|sep|>"
_WRAPPERS = (RESPONSE_OPEN, RESPONSE_CLOSE, MESSAGE_CLOSE)
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


def _attributes(header: str) -> dict[str, str]:
    return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in _ATTRIBUTE.findall(header)}


class ResponseWrappers:
    """Drops the response channel's wrappers and the message end from streamed text.

    A suffix that may still become a wrapper is held until the next chunk (or ``final``), so the
    result does not depend on how the text was split.
    """

    def __init__(self) -> None:
        self._held = ""

    def push(self, text: str, final: bool = False) -> str:
        buf, pos, kept = self._held + text, 0, []
        while True:
            end, marker = find_marker(buf, pos, _WRAPPERS, final)
            kept.append(buf[pos:end])
            if marker is None:
                self._held = buf[end:]
                return "".join(kept)
            pos = end + len(marker)


class KimiK3ToolParser(KimiCallIds, XmlCallParser):
    """``<|open|>tools<|sep|><|open|>call tool="N"<|sep|><|open|>argument key="K" type="T"<|sep|>V…`` (kimi_k3)."""

    section_begin = TOOLS_OPEN
    section_end = "<|close|>tools<|sep|>"
    call_begin = "<|open|>call"
    call_header_ends = ("<|sep|>",)
    call_end = "<|close|>call<|sep|>"
    param_begin = "<|open|>argument"
    param_header_end = "<|sep|>"
    param_end = "<|close|>argument<|sep|>"
    trim = "none"
    id_prefix = ""

    def __init__(self, new_id: Callable[[], str] = new_call_id, schemas: ToolSchemas | None = None,
                 history_tool_calls: int = 0):
        super().__init__(new_id, schemas)
        self.count_calls_from(history_tool_calls)
        self._wrappers = ResponseWrappers()

    def call_name(self, header: str) -> str:
        return _attributes(header).get("tool", "").strip()

    def param_header(self, header: str) -> tuple[str, bool | None]:
        attributes = _attributes(header)
        return attributes.get("key", ""), attributes.get("type", "string") == "string"

    def feed(self, text: str) -> ParsedDelta:
        return super().feed(self._wrappers.push(text))

    def finish(self) -> ParsedDelta:
        rest = self._wrappers.push("", final=True)
        return concat(super().feed(rest), super().finish()) if rest else super().finish()
