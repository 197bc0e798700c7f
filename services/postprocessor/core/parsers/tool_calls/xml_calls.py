"""Tool calls written as tags, one tag per argument: the machinery shared by the XML-style formats.

Qwen3-Coder, GLM-4.5/4.7, MiniMax M2 and DeepSeek V3.2 (DSML) differ only in their markers::

    [SECTION_BEGIN]
      CALL_BEGIN header CALL_HEADER_END          (the header holds the function name)
        PARAM_BEGIN header PARAM_HEADER_END [VALUE_OPEN] raw value PARAM_END
        ...
      CALL_END
      ... more calls ...
    [SECTION_END]

Arguments are built as a JSON object while the text streams: ``{`` when the call starts, then per
parameter ``"name": `` and its value, then ``}``. A string value is streamed as it arrives
(JSON-escaped fragment by fragment, so a 50k-character file body costs one pass); any other value
is held until its end tag and converted by the tool's schema (``param_types.py``). A missing
PARAM_END is tolerated (CALL_END or SECTION_END end the value); a call cut off by the end of the
stream is closed, so its arguments are valid JSON. A block that breaks before a function name is
known is shown as plain text, markers included.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from services.postprocessor.core.parsers.scan import AfterCallText, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.tool_calls.call_block import CallBlock
from services.postprocessor.core.parsers.tool_calls.param_types import JSON, STRING, ToolSchemas, to_json
from services.postprocessor.core.parsers.types import Emitter, TextParser, new_call_id


class _StringValue:
    """Streams one string argument as escaped JSON, trimming the value's edges like the format does.

    ``trim`` is "newline" (one newline after the opening and before the closing tag is layout, as in
    Qwen3-Coder's template), "strip" (all surrounding whitespace) or "none". Trailing text that may
    still be trimmed is held until more text shows it is inside the value.
    """

    def __init__(self, out: Emitter, trim: str):
        self._out = out
        self._trim = trim
        self._first = True
        self._held = ""

    def push(self, text: str) -> None:
        if not text:
            return
        if self._first:
            if self._trim == "strip":
                text = text.lstrip()
                if not text:
                    return
            elif self._trim == "newline" and text.startswith("\n"):
                text = text[1:]
            self._first = False
        text = self._held + text
        if self._trim == "strip":
            body = text.rstrip()
        elif self._trim == "newline" and text.endswith("\n"):
            body = text[:-1]
        else:
            body = text
        self._held = text[len(body):]
        if body:
            self._out.arguments(orjson.dumps(body).decode()[1:-1])

    def close(self) -> None:
        self._out.arguments('"')


def _trimmed(raw: str, trim: str) -> str:
    """A whole value with the format's layout removed (``_StringValue`` does it while streaming)."""
    if trim == "strip":
        return raw.strip()
    if trim == "newline":
        raw = raw[1:] if raw.startswith("\n") else raw
        return raw[:-1] if raw.endswith("\n") else raw
    return raw


class XmlCallParser(TextParser):
    """Subclasses set the markers and say how to read a call's and a parameter's header."""

    section_begin = ""  # "" when every call is its own block
    section_end = ""
    call_begin: str
    call_header_ends: tuple[str, ...]  # the first is consumed; the others end the name and stay
    call_end: str
    param_begin: str
    param_header_end: str
    value_open = ""  # a tag between a parameter's name and its value (GLM's <arg_value>)
    param_end: str
    trim = "strip"

    def __init__(self, new_id: Callable[[], str] = new_call_id, schemas: ToolSchemas | None = None):
        super().__init__(new_id)
        self._schemas = schemas if schemas is not None else ToolSchemas({})
        self._text = AfterCallText(self.out)
        self._state = "content"
        self._block = CallBlock(self._text)
        self._header: list[str] = []
        self._function = ""
        self._params = 0
        self._string: _StringValue | None = None
        self._typed: list[str] = []
        self._kind = STRING

    def call_name(self, header: str) -> str:
        """The function name in a call's header ("" when there is none)."""
        return header.strip()

    def param_header(self, header: str) -> tuple[str, bool | None]:
        """A parameter's name, and whether its value is a string (None: the schema decides)."""
        return header.strip(), None

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            end, marker = find_marker(buf, pos, (self.section_begin or self.call_begin,), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._block.open(marker)
            self._pos = end + len(marker)
            self._state = "between" if self.section_begin else "call_header"
            self._header = []
            return True
        if state in ("call_header", "param_header"):
            return self._read_header(buf, pos, final)
        if state == "value":
            return self._read_value(buf, pos, final)
        if state == "skip_body":  # stray text between a call's parameters is dropped
            end, marker = find_marker(buf, pos, self._body_ends(), final)
            self._pos = end
            if marker is None:
                return False
            self._state = "body"
            return True
        p = skip_ws(buf, pos)
        if state == "value_open":
            verdict = expect(buf, p, self.value_open, final)
            if verdict == "wait" or (p == len(buf) and not final):
                return False
            self._pos = p + len(self.value_open) if verdict == "yes" else pos
            self._state = "value"
            return True
        if state == "between":
            return self._between_calls(buf, p, final)
        return self._in_body(buf, p, final)  # state "body"

    def _between_calls(self, buf: str, p: int, final: bool) -> bool:
        for marker in (self.call_begin, self.section_end):
            verdict = expect(buf, p, marker, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._record(buf[self._pos:p + len(marker)])
                self._pos = p + len(marker)
                if marker == self.call_begin:
                    self._state, self._header = "call_header", []
                else:
                    self._close_block()
                return True
        if p == len(buf):
            return False
        self._close_block()  # other text ends the section (a missing SECTION_END): it is content again
        return True

    def _body_ends(self) -> tuple[str, ...]:
        return (self.param_begin, self.call_end, self.section_end) if self.section_end else \
            (self.param_begin, self.call_end)

    def _in_body(self, buf: str, p: int, final: bool) -> bool:
        for marker in self._body_ends():
            verdict = expect(buf, p, marker, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                if marker == self.param_begin:
                    self._state, self._header, self._pos = "param_header", [], p + len(marker)
                    return True
                self._end_call()
                if marker == self.call_end:
                    self._pos = p + len(marker)
                    self._state = "between" if self.section_begin else "content"
                    if not self.section_begin:
                        self._text.after_call()
                else:
                    self._pos = p  # the section's end: the call was not closed
                    self._state = "between"
                return True
        if p == len(buf):
            return False
        self._state = "skip_body"  # stray text between parameters
        return True

    def _read_header(self, buf: str, pos: int, final: bool) -> bool:
        calling = self._state == "call_header"
        ends = self.call_header_ends if calling else (self.param_header_end,)
        end, marker = find_marker(buf, pos, ends, final)
        self._header.append(buf[pos:end])
        if marker is None:
            self._record(buf[pos:end])
            self._pos = end
            return False
        taken = marker if marker == ends[0] else ""  # a marker that also starts the body stays
        self._record(buf[pos:end] + taken)
        self._pos = end + len(taken)
        header = "".join(self._header)
        self._header = []
        if calling:
            self._start_call(header)
        else:
            self._start_param(header)
        return True

    def _start_call(self, header: str) -> None:
        name = self.call_name(header)
        if not name:
            self._show_raw()
            return
        self.out.start_call(name)
        self.out.arguments("{")
        self._block.call_started()
        self._function, self._params = name, 0
        self._state = "body"

    def _start_param(self, header: str) -> None:
        name, is_string = self.param_header(header)
        self._kind = (STRING if is_string else JSON) if is_string is not None else \
            self._schemas.kind(self._function, name)
        prefix = ", " if self._params else ""
        self._params += 1
        if self._kind == STRING:
            self.out.arguments(f'{prefix}{orjson.dumps(name).decode()}: "')
            self._string = _StringValue(self.out, self.trim)
        else:
            self.out.arguments(f"{prefix}{orjson.dumps(name).decode()}: ")
            self._typed = []
        self._state = "value_open" if self.value_open else "value"

    def _read_value(self, buf: str, pos: int, final: bool) -> bool:
        ends = (self.param_end, *self._body_ends()[1:])
        end, marker = find_marker(buf, pos, ends, final)
        if self._string is not None:
            self._string.push(buf[pos:end])
        else:
            self._typed.append(buf[pos:end])
        self._pos = end + (len(marker) if marker == self.param_end else 0)
        if marker is None:
            return False
        self._end_value()
        self._state = "body"
        return True

    def _end_value(self) -> None:
        if self._string is not None:
            self._string.close()
            self._string = None
        else:
            self.out.arguments(to_json(_trimmed("".join(self._typed), self.trim), self._kind))
            self._typed = []

    def _end_call(self) -> None:
        self.out.arguments("}")

    def _record(self, text: str) -> None:
        self._block.record(text)

    def _show_raw(self) -> None:
        self._block.show_raw()
        self._state = "content"

    def _close_block(self) -> None:
        self._block.close()
        self._state = "content"

    def _end(self) -> None:
        state = self._state
        if state in ("value", "value_open"):
            self._end_value()
        if state in ("body", "skip_body", "param_header", "value_open", "value"):
            self._end_call()
            self._block.discard()
            self._state = "content"
        elif state in ("between", "call_header"):
            self._show_raw()
        self._text.call_starts()  # whitespace after the last call is dropped
