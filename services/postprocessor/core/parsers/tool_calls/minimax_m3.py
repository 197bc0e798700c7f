"""MiniMax M3 tool calls: every tag is preceded by the namespace token ``]<]minimax[>[`` (one token)::

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_weather">
    ]<]minimax[>[<city>Paris]<]minimax[>[</city>
    ]<]minimax[>[<days>3]<]minimax[>[</days>
    ]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

A parameter is a tag named by its key. Objects and arrays nest the same way (``<item>`` per array
element; members by name), so the request's tool schema types the leaves, as in MiniMax M2
(``param_types.py``); without a schema, a value whose first child is ``<item>`` is an array. Layout
whitespace between the token and a tag is dropped, as SGLang's ``minimax-m3`` parser does. String values
stream as they arrive and are kept exactly; other values are emitted when their end tag arrives.
The M3 template's parser names ``minimax_m3_nom`` / ``minimax-m3-nom`` read the same markup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import orjson

from services.postprocessor.core.parsers.scan import find_marker, partial_suffix
from services.postprocessor.core.parsers.tool_calls.param_types import STRING, ToolSchemas, kind_of, to_json
from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser
from services.postprocessor.core.parsers.types import ParsedDelta, concat, new_call_id

NS = "]<]minimax[>["
BLOCK_OPEN, BLOCK_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE_OPEN = NS + '<invoke name="'
_SPACING = re.compile(re.escape(NS) + r"[ \t\r\n]+(?=<)")


class _TagSpacing:
    """Drops whitespace between the namespace token and the tag after it, whatever the chunking."""

    def __init__(self) -> None:
        self._held = ""

    def push(self, text: str, final: bool = False) -> str:
        buf = self._held + text
        keep = len(buf)
        if not final:
            last = buf.rfind(NS)
            if last >= 0 and buf[last + len(NS):].isspace() or last >= 0 and last + len(NS) == len(buf):
                keep = last  # the token and only layout after it: the next chunk decides
            else:
                keep = len(buf) - partial_suffix(buf, 0, (NS,))
        self._held = buf[keep:]
        return _SPACING.sub(NS, buf[:keep])


def _leaf(text: str, schema: dict | None) -> object:
    if schema is None:  # inside an untyped container only JSON's literals are unambiguous (SGLang's rule)
        return {"true": True, "false": False, "null": None}.get(text.strip(), text)
    return orjson.loads(to_json(text, kind_of(schema)))


def _child_schema(schema: dict | None, tag: str) -> dict | None:
    if schema is None:
        return None
    if tag == "item" and isinstance(schema.get("items"), dict):
        return schema["items"]
    child = (schema.get("properties") or {}).get(tag)
    return child if isinstance(child, dict) else None


def _nested(body: str, schema: dict | None) -> object:
    """A value written as nested tags, as JSON (children of one name repeat into a list)."""
    root: list = ["", "", []]  # [tag, text, children]
    stack = [root]
    for piece in body.split(NS):
        piece = piece.strip()
        if piece.startswith("</"):
            if len(stack) > 1:
                stack.pop()
        elif piece.startswith("<") and ">" in piece:
            tag, _, text = piece[1:].partition(">")
            node: list = [tag.strip(), text, []]
            stack[-1][2].append(node)
            stack.append(node)
        elif piece:
            stack[-1][1] += piece
    return _value(root, schema)


def _value(node: list, schema: dict | None) -> object:
    _, text, children = node
    if not children:
        return _leaf(text, schema)
    declared = (schema or {}).get("type")
    if declared == "array" or (declared is None and children[0][0] == "item"):
        return [_value(c, _child_schema(schema, "item")) for c in children]
    out: dict = {}
    for child in children:
        value = _value(child, _child_schema(schema, child[0]))
        if child[0] in out:
            prior = out[child[0]]
            out[child[0]] = [*prior, value] if isinstance(prior, list) else [prior, value]
        else:
            out[child[0]] = value
    return out


class MiniMaxM3ToolParser(XmlCallParser):
    """``]<]minimax[>[<tool_call>]<]minimax[>[<invoke name="N">]<]minimax[>[<K>V]<]minimax[>[</K>…`` (minimax_m3).

    It shares XmlCallParser's block, text and schema handling; the scanner is its own, because a
    parameter's end tag is named by the parameter.
    """

    section_begin, section_end, call_begin, call_end = BLOCK_OPEN, BLOCK_CLOSE, INVOKE_OPEN, NS + "</invoke>"

    def __init__(self, new_id: Callable[[], str] = new_call_id, schemas: ToolSchemas | None = None):
        super().__init__(new_id, schemas)
        self._spacing = _TagSpacing()
        self._key = ""
        self._value: list[str] = []
        self._string_started = False

    def feed(self, text: str) -> ParsedDelta:
        return super().feed(self._spacing.push(text))

    def finish(self) -> ParsedDelta:
        rest = self._spacing.push("", final=True)
        return concat(super().feed(rest), super().finish()) if rest else super().finish()

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos, state = self._buf, self._pos, self._state
        if state == "content":
            end, marker = find_marker(buf, pos, (BLOCK_OPEN,), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._block.open(marker)
            self._pos, self._state = end + len(marker), "between"
            return True
        if state == "between":  # inside the block, between calls: text that is not a call is dropped
            end, marker = find_marker(buf, pos, (INVOKE_OPEN, BLOCK_CLOSE), final)
            self._record(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._record(marker)
            self._pos = end + len(marker)
            if marker == BLOCK_CLOSE:
                self._close_block()
            else:
                self._state = "call_header"
            return True
        if state == "call_header":
            end = buf.find('">', pos)
            if end < 0:
                return False
            self._record(buf[pos:end + 2])
            self._pos = end + 2
            self._start_call(buf[pos:end])
            return True
        if state == "body":
            return self._tag(buf, pos, final)
        return self._param_value(buf, pos, final)  # state "value"

    def _tag(self, buf: str, pos: int, final: bool) -> bool:
        start = buf.find(NS + "<", pos)
        if start < 0:
            self._pos = len(buf) - (0 if final else partial_suffix(buf, pos, (NS + "<",)))
            return False
        close = buf.find(">", start + len(NS) + 1)  # the token itself holds a ">"
        if close < 0:
            self._pos = start
            return False
        tag = buf[start + len(NS) + 1:close].strip()
        self._pos = close + 1
        if tag in ("/invoke", "/tool_call"):
            self._end_call()
            self._state = "between"
            if tag == "/tool_call":
                self._close_block()
        elif not tag.startswith("/"):
            self._key, self._value = tag, []
            prefix = ", " if self._params else ""
            self._params += 1
            self.out.arguments(f"{prefix}{orjson.dumps(tag).decode()}: ")
            self._state = "value"
            self._string_started = False
        return True

    def _param_value(self, buf: str, pos: int, final: bool) -> bool:
        schema = self._schemas.schema(self._function, self._key)
        end_tag = f"{NS}</{self._key}>"
        end, marker = find_marker(buf, pos, (end_tag, self.call_end, BLOCK_CLOSE), final)
        if schema is not None and kind_of(schema) == STRING:  # a described string streams as it arrives
            self._stream_string(buf[pos:end])
        else:  # anything else may be nested markup: held until its end tag
            self._value.append(buf[pos:end])
        self._pos = end + (len(marker) if marker == end_tag else 0)  # a missing end tag: the call's end ends it
        if marker is None:
            return False
        self._end_value_m3(schema)
        self._state = "body"
        return True

    def _stream_string(self, text: str) -> None:
        if not self._string_started:
            self.out.arguments('"')
            self._string_started = True
        if text:
            self.out.arguments(orjson.dumps(text).decode()[1:-1])

    def _end_value_m3(self, schema: dict | None) -> None:
        if self._string_started:
            self.out.arguments('"')
        else:
            raw = "".join(self._value)
            if raw.lstrip().startswith(NS):
                # json's default separators, as the raw-text formats' own JSON is written
                self.out.arguments(json.dumps(_nested(raw, schema), ensure_ascii=False))
            else:  # a parameter the schema does not describe is a string, as in every raw-text format
                self.out.arguments(to_json(raw, kind_of(schema)))
        self._value, self._string_started = [], False

    def _end(self) -> None:
        if self._state == "call_header":  # cut inside the function's name: the block is shown as it was
            self._record(self._buf[self._pos:])
        if self._state == "value":
            self._end_value_m3(self._schemas.schema(self._function, self._key))
            self._state = "body"
        super()._end()
