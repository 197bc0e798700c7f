"""Pythonic tool calls: the reply is a Python list of calls, ``[get_weather(city="Paris"), f(n=1)]``.

Llama 3.2/4 (and ``<|python_start|>`` … ``<|python_end|>`` wrapped Llama 4 output). Keyword
arguments are Python literals; each becomes a JSON member as soon as its value is complete, so the
arguments stream one member at a time. A value that is not a literal is passed as its source text
(a JSON string). A reply that does not open with ``[name(`` is plain content.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from services.postprocessor.core.parsers.scan import AfterCallText, expect, skip_ws
from services.postprocessor.core.parsers.types import TextParser, new_call_id

PY_START = "<|python_start|>"
PY_END = "<|python_end|>"
_HEAD = re.compile(r"([A-Za-z_][\w.\-]*)\s*\(")
_HEAD_PREFIX = re.compile(r"[A-Za-z_][\w.\-]*\s*")
_OPEN = re.compile(r"\[\s*[A-Za-z_][\w.\-]*\s*\(")
_OPEN_PREFIX = re.compile(r"\[\s*(?:[A-Za-z_][\w.\-]*\s*)?")
_KEY = re.compile(r"([A-Za-z_]\w*)\s*=")
_KEY_PREFIX = re.compile(r"[A-Za-z_]\w*\s*")
_PY_INTERESTING = re.compile(r"[()\[\]{},'\"]")
_QUOTE_STOP = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}


class PythonValueScanner:
    """Finds the end of one Python literal: depth 0 and the next ``,`` or ``)`` (not consumed)."""

    __slots__ = ("depth", "done", "_escape", "_quote")

    def __init__(self) -> None:
        self.depth = 0
        self.done = False
        self._quote = ""
        self._escape = False

    def scan(self, buf: str, pos: int) -> int:
        n = len(buf)
        while pos < n and not self.done:
            if self._escape:
                self._escape, pos = False, pos + 1
                continue
            if self._quote:
                m = _QUOTE_STOP[self._quote].search(buf, pos)
                if m is None:
                    return n
                pos = m.end()
                if m.group() == "\\":
                    self._escape = True
                else:
                    self._quote = ""
                continue
            m = _PY_INTERESTING.search(buf, pos)
            if m is None:
                return n
            c = m.group()
            if c in "([{":
                self.depth += 1
            elif c in ")]}" or c == ",":
                if self.depth == 0:
                    self.done = True
                    return m.start()
                if c != ",":
                    self.depth -= 1
            else:
                self._quote = c
            pos = m.end()
        return pos


def _json_value(source: str) -> str:
    try:
        value: Any = ast.literal_eval(source)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = source
    return json.dumps(value, ensure_ascii=False, default=str)


class PythonicToolParser(TextParser):
    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "start"
        self._text = AfterCallText(self.out)
        self._arg_name = ""
        self._members = 0
        self._value: PythonValueScanner | None = None
        self._parts: list[str] = []

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if self._state == "content":
            self._text.content(buf[pos:])
            self._pos = len(buf)
            return False
        if self._state == "start":
            return self._start(buf, pos, final)
        if self._state == "value":
            return self._scan_value(buf, pos)
        p = skip_ws(buf, pos)
        if p == len(buf):
            return False
        return getattr(self, f"_{self._state}")(buf, p, final)

    def _start(self, buf: str, pos: int, final: bool) -> bool:
        p = skip_ws(buf, pos)
        verdict = expect(buf, p, PY_START, final)
        if verdict == "wait" or (p == len(buf) and not final):
            return False
        q = skip_ws(buf, p + len(PY_START)) if verdict == "yes" else p
        if _OPEN.match(buf, q):
            self._state, self._pos = "head", q + 1
        elif not final and (q == len(buf) or _OPEN_PREFIX.fullmatch(buf, q)):
            return False
        else:
            self._state = "content"
        return True

    def _head(self, buf: str, p: int, final: bool) -> bool:
        m = _HEAD.match(buf, p)
        if m is None:
            return self._partial_or_fail(_HEAD_PREFIX, buf, p, final)
        self._text.call_starts()
        self.out.start_call(m.group(1))
        self.out.arguments("{")
        self._members = 0
        self._state, self._pos = "key", m.end()
        return True

    def _key(self, buf: str, p: int, final: bool) -> bool:
        if buf[p] == ")":
            return self._close_call(p + 1)
        m = _KEY.match(buf, p)
        if m is None:
            return self._partial_or_fail(_KEY_PREFIX, buf, p, final)
        self._arg_name, self._value, self._parts = m.group(1), None, []
        self._state, self._pos = "value", m.end()
        return True

    def _scan_value(self, buf: str, pos: int) -> bool:
        if self._value is None:
            pos = skip_ws(buf, pos)
            if pos == len(buf):
                self._pos = pos
                return False
            self._value = PythonValueScanner()
        new = self._value.scan(buf, pos)
        self._parts.append(buf[pos:new])
        self._pos = new
        if not self._value.done:
            return False
        sep = ", " if self._members else ""
        name = json.dumps(self._arg_name, ensure_ascii=False)
        self.out.arguments(f"{sep}{name}: {_json_value(''.join(self._parts).strip())}")
        self._members += 1
        self._state = "after_value"
        return True

    def _after_value(self, buf: str, p: int, final: bool) -> bool:
        if buf[p] == ",":
            self._state, self._pos = "key", p + 1
            return True
        return self._close_call(p + 1)  # the scanner stops only at "," or ")"

    def _close_call(self, pos: int) -> bool:
        self.out.arguments("}")
        self._text.after_call()
        self._state, self._pos = "after_call", pos
        return True

    def _after_call(self, buf: str, p: int, final: bool) -> bool:
        if buf[p] == ",":
            self._state, self._pos = "head", p + 1
            return True
        if buf[p] == "]":
            self._state, self._pos = "tail", p + 1
            return True
        self._state = "content"
        return True

    def _tail(self, buf: str, p: int, final: bool) -> bool:
        verdict = expect(buf, p, PY_END, final)
        if verdict == "wait":
            return False
        self._pos = p + len(PY_END) if verdict == "yes" else self._pos
        self._state = "content"
        return True

    def _partial_or_fail(self, prefix: re.Pattern[str], buf: str, p: int, final: bool) -> bool:
        if not final and prefix.fullmatch(buf, p):
            return False
        self._state = "content"  # malformed: the rest is shown as text
        return True

    def _end(self) -> None:
        if self._state == "start":
            self._text.content(self._buf[self._pos:])
        self._text.call_starts()
