"""Gemma 4 tool calls: ``<|tool_call>call:name{key:<|"|>text<|"|>,n:42,o:{…},l:[…]}<tool_call|>``, any number.

Gemma 4's call syntax is not JSON: keys are bare, strings are delimited by the ``<|"|>`` token, and
other values are bare words (``42``, ``1.5``, ``true``, ``null``/``none``/``nil``), objects and
lists. The arguments are converted to compact JSON while they stream (``{"key":"text","n":42}``, the
shape Dynamo's serde output has): a string is forwarded as it arrives, a bare value when the
character after it arrives. A bare word that is no JSON scalar becomes a string (Dynamo drops the
whole arguments to ``{}`` there; a string keeps what the model said). ``key:`` with no value is
``""``. Calls follow each other with no separator; text around them is content. A block that
breaks before its ``{`` is shown as plain text; a call cut off by the end of the output is closed so
its arguments are valid JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.types import Emitter, TextParser, new_call_id

CALL_OPEN = "<|tool_call>"
CALL_CLOSE = "<tool_call|>"
STRING_DELIM = '<|"|>'
CALL_PREFIX = "call:"
_NAME = re.compile(r"[\w\-.]*")
_KEY = re.compile(r"[\w\-.]+")
_BARE = re.compile(r"[^,}\]]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?\Z")
_KEYWORDS = {"true": "true", "false": "false", "null": "null", "none": "null", "nil": "null"}


def _bare_value(word: str) -> str:
    """A bare value as JSON: a number, a keyword (any case), "" when empty, else the word as a string."""
    word = word.strip()
    if not word:
        return '""'
    number = _NUMBER.match(word)
    if number:
        return json.dumps(float(word)) if number.group(1) else str(int(word))
    keyword = _KEYWORDS.get(word.lower())
    return keyword or json.dumps(word, ensure_ascii=False)


class Gemma4Arguments:
    """Converts one call's ``{…}`` body to JSON as it streams; ``done`` after the closing brace."""

    def __init__(self, out: Emitter):
        self.out = out
        self.done = False
        self._stack: list[str] = []  # "{" / "[" per open container
        self._expect = "key"  # key | colon | value | after | string
        self._first = True  # the container just opened (no "," before its first member)

    def consume(self, buf: str, pos: int, final: bool) -> int:
        """Reads from ``pos`` as far as the text allows; returns the new position."""
        while not self.done:
            if self._expect == "string":
                pos, more = self._string(buf, pos, final)
            else:
                pos = skip_ws(buf, pos)
                if pos >= len(buf):
                    return pos
                pos, more = self._token(buf, pos, final)
            if not more:
                return pos
        return pos

    def _string(self, buf: str, pos: int, final: bool) -> tuple[int, bool]:
        end, marker = find_marker(buf, pos, (STRING_DELIM,), final)
        self.out.arguments(json.dumps(buf[pos:end], ensure_ascii=False)[1:-1])
        if marker is None:
            return end, False
        self.out.arguments('"')
        self._expect = "after"
        return end + len(marker), True

    def _token(self, buf: str, pos: int, final: bool) -> tuple[int, bool]:  # noqa: PLR0911 - one per token kind
        """One token outside strings; (new position, whether to go on)."""
        c, expecting = buf[pos], self._expect
        if expecting == "key":
            if c == "}":
                return self._close(pos), True
            key = _KEY.match(buf, pos)
            if key is None:  # not a bare key: skipped, as Dynamo's grammar has no other key form
                return pos + 1, True
            if key.end() == len(buf) and not final:
                return pos, False
            self.out.arguments(("" if self._first else ",") + json.dumps(key.group(), ensure_ascii=False))
            self._expect, self._first = "colon", False
            return key.end(), True
        if expecting == "colon":
            if c == ":":
                self.out.arguments(":")
                self._expect = "value"
            return pos + 1, True
        if expecting == "value":
            new = self._value(buf, pos, final)
            return (-new - 1, False) if new < 0 else (new, True)
        if c == ",":
            self._expect = "key" if self._stack[-1] == "{" else "value"
        elif c in "}]":
            return self._close(pos), True
        return pos + 1, True  # a separator, or stray text between members (not part of any value)

    def open(self) -> None:
        """The body's opening brace was read."""
        self._stack, self._expect, self._first = ["{"], "key", True
        self.out.arguments("{")

    def finish(self) -> None:
        """The output ended inside the body: close what is open so the arguments are valid JSON."""
        if self._expect == "string":
            self.out.arguments('"')
        elif self._expect in ("colon", "value") and self._stack[-1] == "{":
            self.out.arguments(("" if self._expect == "value" else ":") + '""')
        self.out.arguments("".join("}" if c == "{" else "]" for c in reversed(self._stack)))
        self._stack, self.done = [], True

    def _value(self, buf: str, pos: int, final: bool) -> int:
        """Starts a value at ``pos``; a negative result means "wait for more text at -result-1"."""
        in_list = self._stack[-1] == "["
        c = buf[pos]
        if in_list and c == "]" and self._first:  # an empty list
            return self._close(pos)
        verdict = expect(buf, pos, STRING_DELIM, final)
        if verdict == "wait":
            return -pos - 1
        sep = "," if in_list and not self._first else ""
        if verdict == "yes":
            self.out.arguments(sep + '"')
            self._expect, self._first = "string", False
            return pos + len(STRING_DELIM)
        if c in "{[":
            self.out.arguments(sep + c)
            self._stack.append(c)
            self._expect, self._first = ("key" if c == "{" else "value"), True
            return pos + 1
        word = _BARE.match(buf, pos)
        assert word is not None
        if word.end() == len(buf) and not final:
            return -pos - 1
        self.out.arguments(sep + _bare_value(word.group()))
        self._expect, self._first = "after", False
        return word.end()

    def _close(self, pos: int) -> int:
        opened = self._stack.pop()
        self.out.arguments("}" if opened == "{" else "]")
        self._expect, self._first = "after", False
        if not self._stack:
            self.done = True
        return pos + 1


class Gemma4ToolParser(TextParser):
    """``<|tool_call>call:name{…}<tool_call|>`` blocks (names: gemma4, gemma-4)."""

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "content"
        self._text = AfterCallText(self.out)
        self._args: Gemma4Arguments | None = None
        self._raw: list[str] = []  # the block's text until its call starts (shown if it breaks)

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one branch per state
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            end, marker = find_marker(buf, pos, (CALL_OPEN, CALL_CLOSE), final)
            self._text.content(buf[pos:end])
            self._pos = end + len(marker or "")
            if marker == CALL_OPEN:  # a stray closing marker is dropped
                self._state, self._raw = "prefix", [marker]
                self._text.call_starts()
            return marker is not None
        if state == "prefix":
            verdict = expect(buf, pos, CALL_PREFIX, final)
            if verdict == "wait":
                return False
            if verdict == "no":
                return self._broken()
            self._raw.append(CALL_PREFIX)
            self._state, self._pos = "name", pos + len(CALL_PREFIX)
            return True
        if state == "name":
            name = _NAME.match(buf, pos)
            assert name is not None
            end = name.end()
            if end == len(buf) and not final:
                return False
            if not name.group() or end == len(buf) or buf[end] != "{":
                self._raw.append(name.group())
                self._pos = end
                return self._broken()
            self.out.start_call(name.group())
            self._args = Gemma4Arguments(self.out)
            self._args.open()
            self._state, self._pos, self._raw = "args", end + 1, []
            return True
        if state == "args":
            args = self._args
            assert args is not None
            self._pos = args.consume(buf, pos, final)
            if not args.done:
                return False
            self._state = "close"
            return True
        # "close": drop what is left of the block up to its closing marker.
        end, marker = find_marker(buf, pos, (CALL_CLOSE,), final)
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        self._state, self._args = "content", None
        self._text.after_call()
        return True

    def _broken(self) -> bool:
        """The block is not a call: its text so far is content, and reading goes on from here."""
        self._text.content("".join(self._raw))
        self._raw, self._state = [], "content"
        return True

    def _end(self) -> None:
        if self._args is not None and not self._args.done:
            self._args.finish()
        self._text.call_starts()  # whitespace after the last call is dropped
