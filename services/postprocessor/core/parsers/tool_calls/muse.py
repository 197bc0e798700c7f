"""Muse Glimmer tool calls: ATEM invokes in a tool channel (names: muse, muse_glimmer).

::

    <|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    <atem:parameter name="days">3</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>

The channels (reasoning, answer, tool) are read by ``core/parsers/muse_channels.py``; this parser
reads the ATEM calls of tool channels only, so an invoke quoted in the reasoning or the answer stays
text. As in Dynamo, vLLM and SGLang:

- a value is JSON when all of it is (``3``, ``{"a": [1]}``, ``"quoted"``), else the text exactly as
  written, whitespace included; so a call is sent whole when its ``</atem:invoke>`` arrives (until then
  ``3`` could still become ``3 apples``), with its arguments as compact JSON (Dynamo's bytes);
- an invoke the channel's end cuts off (no ``</atem:invoke>``, or a parameter without
  ``</atem:parameter>``) is dropped, as is text around the invokes and the ``function_calls`` wrapper;
- the name is the invoke's ``name`` attribute; ``f.f`` is ``f`` when the request offered ``f`` (the
  template writes a bare tool name as ``f.*``), any other name passes through;
- a repeated parameter keeps its last value.

JSON numbers follow Dynamo's reading (serde_json): ``-0`` and integers past 64 bits are floats; NaN,
Infinity and out-of-range floats are not JSON, so such a value stays text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import orjson

from services.postprocessor.core.parsers.muse_channels import MuseChannels
from services.postprocessor.core.parsers.scan import find_marker
from services.postprocessor.core.parsers.types import Emitter, new_call_id

INVOKE_OPEN = "<atem:invoke"
INVOKE_CLOSE = "</atem:invoke>"
PARAM_OPEN = "<atem:parameter"
PARAM_CLOSE = "</atem:parameter>"
_NAME_ATTR = re.compile(r'\bname="([^"]+)"')


class _NotJson(ValueError):
    pass


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(text)
    return value


def _int(text: str) -> int | float:
    if text == "-0":
        return -0.0
    value = int(text)
    return value if -(2**63) <= value < 2**64 else _float(text)


def _reject(text: str) -> float:
    raise _NotJson(text)


def decode_value(raw: str) -> object:
    """A parameter's value: the JSON it holds, or the text itself."""
    try:
        return json.loads(raw, parse_float=_float, parse_int=_int, parse_constant=_reject)
    except ValueError:
        return raw


def tool_names(tools_json: str) -> frozenset[str]:
    """The function names of the request's ``tools`` (OpenAI JSON, validated by the gateway)."""
    tools = orjson.loads(tools_json) if tools_json else []
    names = set()
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


class AtemReader:
    """The ATEM calls of one tool channel's text, fed in pieces; each call is emitted when it closes."""

    def __init__(self, out: Emitter, names: frozenset[str]):
        self._out = out
        self._names = names
        self._buf = ""
        self._held = 0
        self._state = "outside"
        self._tag: list[str] = []
        self._value: list[str] = []
        self._function = ""
        self._key = ""
        self._args: dict[str, object] = {}
        self.emitted = 0

    def feed(self, text: str, final: bool = False) -> None:
        buf = self._buf + text
        pos = 0
        while True:
            step = self._step(buf, pos, final)
            if step is None:
                break
            pos = step
        self._buf = buf[self._held:]

    def close(self) -> None:
        """The channel ended: an invoke still open was cut off and is dropped."""
        self._buf, self._state, self._tag, self._value, self._args = "", "outside", [], [], {}

    def _step(self, buf: str, pos: int, final: bool) -> int | None:
        """Consumes from ``pos``; returns the new position, or None (setting ``_held``) when it must wait."""
        state = self._state
        if state in ("invoke_tag", "param_tag"):
            end, marker = find_marker(buf, pos, (">",), final)
            self._tag.append(buf[pos:end])
            return self._held_at(end) if marker is None else self._tag_done(end + 1)
        if state == "value":
            end, marker = find_marker(buf, pos, (PARAM_CLOSE,), final)
            self._value.append(buf[pos:end])
            if marker is None:
                return self._held_at(end)
            if self._key:
                self._args[self._key] = decode_value("".join(self._value))
            self._value, self._state = [], "invoke"
            return end + len(marker)
        markers = (INVOKE_OPEN,) if state == "outside" else (PARAM_OPEN, INVOKE_CLOSE)
        end, marker = find_marker(buf, pos, markers, final)  # text around the calls is dropped
        if marker is None:
            return self._held_at(end)
        if marker == INVOKE_CLOSE:
            self._emit_call()
            self._state = "outside"
        else:
            self._state, self._tag = ("invoke_tag" if marker == INVOKE_OPEN else "param_tag"), []
        return end + len(marker)

    def _held_at(self, end: int) -> int | None:
        """Waits for more text: the buffer from ``end`` on is kept for the next piece."""
        self._held = end
        return None

    def _tag_done(self, pos: int) -> int:
        name = _NAME_ATTR.search("".join(self._tag))
        self._tag = []
        if self._state == "invoke_tag":
            self._function, self._args = (name.group(1) if name else ""), {}
            self._state = "invoke"
        else:
            self._key = name.group(1) if name else ""  # a parameter without a name: its value is dropped
            self._state = "value"
        return pos

    def _emit_call(self) -> None:
        name, args = self._function, self._args
        self._args = {}
        if not name:
            return  # an invoke without a name calls nothing
        head, dot, tail = name.partition(".")
        if dot and head == tail and head in self._names and name not in self._names:
            name = head
        self._out.start_call(name)
        self._out.arguments(json.dumps(args, ensure_ascii=False, separators=(",", ":"), allow_nan=False))
        self.emitted += 1


class MuseToolParser(MuseChannels):
    """Muse's channels with the tool channels' calls read (reasoning and content as ``MuseChannels`` splits them).

    Args:
        names: the function names the request offered (for the ``f.f`` spelling).
        thinking: False when the request switched thinking off (``self`` bodies are content).
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id, names: frozenset[str] = frozenset(),
                 thinking: bool = True, prompt_opens_reasoning: bool = False):
        super().__init__(prompt_opens_reasoning=prompt_opens_reasoning, thinking=thinking, new_id=new_id)
        self._atem = AtemReader(self.out, names)

    def _tool_text(self, text: str, final: bool) -> None:
        before = self._atem.emitted
        self._atem.feed(text, final)
        if self._atem.emitted != before:
            self._call_emitted()

    def _tool_end(self) -> None:
        self._atem.close()
