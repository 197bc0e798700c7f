"""Incremental scanning helpers shared by the parsers: markers, JSON values, JSON call objects.

All of them work from a position in a buffer and keep their own state between chunks, so a text is
scanned once whatever way it is split; regexes jump over runs of uninteresting characters (a 50k
character string argument is one ``search``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from services.postprocessor.core.parsers.types import Emitter

_STRING_STOP = re.compile(r'["\\]')
# Outside strings, JSON is structure, separators, whitespace, numbers and true/false/null.
_JSON_INTERESTING = re.compile(r"[^,:\s0-9.eE+\-truefalsn]")
_SCALAR_END = re.compile(r"[^0-9.eE+\-truefalsn]")
_SCALAR_START = frozenset("-0123456789tfn")


def find_marker(buf: str, pos: int, markers: Sequence[str], final: bool) -> tuple[int, str | None]:
    """Where text before the next marker ends, and the marker found there (or None).

    Without a marker, the returned end stops short of a suffix that could still become a marker
    (held back until the next chunk), unless ``final``.
    """
    best, found = -1, None
    for marker in markers:
        i = buf.find(marker, pos)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, marker
    if found is not None:
        return best, found
    if final:
        return len(buf), None
    return len(buf) - partial_suffix(buf, pos, markers), None


def partial_suffix(buf: str, pos: int, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``buf[pos:]`` that is a proper prefix of a marker."""
    longest = max(len(m) for m in markers) - 1
    start = max(pos, len(buf) - longest)
    for i in range(start, len(buf)):
        tail = buf[i:]
        if any(m.startswith(tail) for m in markers):
            return len(buf) - i
    return 0


def skip_ws(buf: str, pos: int) -> int:
    n = len(buf)
    while pos < n and buf[pos].isspace():
        pos += 1
    return pos


def expect(buf: str, pos: int, literal: str, final: bool) -> str:
    """'yes' if ``literal`` is at ``pos``, 'wait' if the buffer ends inside it, else 'no'."""
    piece = buf[pos:pos + len(literal)]
    if piece == literal:
        return "yes"
    if not final and literal.startswith(piece) and pos + len(piece) == len(buf):
        return "wait"
    return "no"


class JsonValueScanner:
    """Finds where one JSON value ends in streamed text.

    ``scan`` consumes from ``pos`` and returns the new position; ``done`` is set once the value is
    complete (for a number or literal that is when the next character is not part of it, which is
    not consumed) and ``error`` when a character cannot belong to JSON (not consumed either).
    """

    __slots__ = ("depth", "done", "error", "_escape", "_in_string", "_scalar", "_started")

    def __init__(self) -> None:
        self.depth = 0
        self.done = False
        self.error = False
        self._in_string = False
        self._escape = False
        self._scalar = False
        self._started = False

    def scan(self, buf: str, pos: int, final: bool = False) -> int:
        n = len(buf)
        if not self._started and pos < n:
            pos = self._start(buf[pos], pos)
            if self.error:
                return pos
        while pos < n and not self.done and not self.error:
            # Each step returns where it stopped, or None when the buffer ended inside its token.
            if self._in_string:
                step = self._string_step(buf, pos)
            elif self._scalar:
                step = self._scalar_step(buf, pos)
            else:
                step = self._structure_step(buf, pos)
            if step is None:
                return n
            pos = step
        if final and self._scalar and self._started:
            self.done = True
        return pos

    def _start(self, c: str, pos: int) -> int:
        """The value's first character: its kind; an error (not consumed) if no JSON value starts so."""
        self._started = True
        if c in "{[":
            self.depth = 1
        elif c == '"':
            self._in_string = True
        elif c in _SCALAR_START:
            self._scalar = True
        else:
            self.error = True
            return pos
        return pos + 1

    def _string_step(self, buf: str, pos: int) -> int | None:
        if self._escape:
            self._escape = False
            return pos + 1
        m = _STRING_STOP.search(buf, pos)
        if m is None:
            return None
        if m.group() == "\\":
            self._escape = True
        else:
            self._in_string = False
            self.done = self.depth == 0
        return m.end()

    def _scalar_step(self, buf: str, pos: int) -> int | None:
        m = _SCALAR_END.search(buf, pos)
        if m is None:
            return None
        self.done = True
        return m.start()

    def _structure_step(self, buf: str, pos: int) -> int | None:
        m = _JSON_INTERESTING.search(buf, pos)
        if m is None:
            return None
        c = m.group()
        if c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        elif c == '"':
            self._in_string = True
        else:
            self.error = True
            return m.start()
        return m.end()


_NAME_KEYS = ("name",)
_ARG_KEYS = ("arguments", "parameters")


class ArgumentStream:
    """One call's arguments given as a bare JSON value: streamed fragment by fragment as it is scanned.

    Leading whitespace is skipped (and left unconsumed until the value starts, so nothing is decided
    early); the value is done when complete, or malformed, which ends the call all the same.
    """

    def __init__(self) -> None:
        self._value: JsonValueScanner | None = None

    def reset(self) -> None:
        self._value = None

    def step(self, out: Emitter, buf: str, pos: int, final: bool) -> tuple[int, bool]:
        """Emits what is scannable from ``pos``; returns (the new position, whether the value ended)."""
        if self._value is None:
            start = skip_ws(buf, pos)
            if start == len(buf):
                return pos, False
            pos, self._value = start, JsonValueScanner()
        new = self._value.scan(buf, pos, final)
        out.arguments(buf[pos:new])
        return new, self._value.done or self._value.error


class JsonCallReader:
    """Reads one ``{"name": ..., "arguments": {...}}`` object, streaming the call as it goes.

    The call starts (id and name emitted) once the name string is complete; the arguments value is
    forwarded verbatim, fragment by fragment, as it is scanned (buffered if it comes before the
    name). Arguments given as a JSON string are decoded once complete. An object with a name and no
    arguments gets ``{}``. ``started`` tells the caller whether anything was emitted, so a block
    that turns out malformed before that can be shown as plain text instead.
    """

    def __init__(self, out: Emitter):
        self.out = out
        self.started = False
        self.done = False
        self.error = False
        self._state = "open"
        self._key_parts: list[str] = []
        self._key = ""
        self._value: JsonValueScanner | None = None
        self._value_parts: list[str] = []
        self._pending_args: list[str] = []
        self._args_seen = False
        self._args_is_string = False

    def consume(self, buf: str, pos: int, final: bool) -> int:
        """Reads from ``pos`` as far as possible; returns the new position."""
        while pos < len(buf) and not (self.done or self.error):
            state = self._state
            new = self._advance(buf, pos, final)
            if new == pos and state == self._state:
                break
            pos = new
        if final and not (self.done or self.error) and self._value is not None:
            self._value.scan(buf, pos, final=True)  # a number at the very end completes here
        return pos

    def _fail(self, pos: int) -> int:
        self.error = True
        return pos

    def _advance(self, buf: str, pos: int, final: bool) -> int:  # noqa: PLR0911 - one branch per state
        state = self._state
        if state in ("open", "key_or_end", "colon", "value_start", "after_value"):
            pos = skip_ws(buf, pos)
            if pos >= len(buf):
                return pos
            c = buf[pos]
            if state == "open":
                return self._go("key_or_end", pos + 1) if c == "{" else self._fail(pos)
            if state == "key_or_end":
                if c == "}":
                    return self._complete(pos + 1)
                if c != '"':
                    return self._fail(pos)
                self._value, self._key_parts = JsonValueScanner(), []
                return self._go("key", pos)
            if state == "colon":
                return self._go("value_start", pos + 1) if c == ":" else self._fail(pos)
            if state == "after_value":
                if c == ",":
                    return self._go("key_or_end", pos + 1)
                return self._complete(pos + 1) if c == "}" else self._fail(pos)
            return self._start_value(buf, pos)
        if state == "key":
            return self._scan_key(buf, pos, final)
        return self._scan_value(buf, pos, final)

    def _go(self, state: str, pos: int) -> int:
        self._state = state
        return pos

    def _scan_key(self, buf: str, pos: int, final: bool) -> int:
        assert self._value is not None
        new = self._value.scan(buf, pos, final)
        self._key_parts.append(buf[pos:new])
        if self._value.error:
            return self._fail(new)
        if self._value.done:
            try:
                self._key = orjson.loads("".join(self._key_parts))
            except orjson.JSONDecodeError:
                return self._fail(new)
            self._state = "colon"
        return new

    def _start_value(self, buf: str, pos: int) -> int:
        self._value, self._value_parts = JsonValueScanner(), []
        if self._key in _ARG_KEYS and not self._args_seen:
            self._args_seen = True
            self._args_is_string = buf[pos] == '"'
            self._state = "args" if not self._args_is_string else "args_string"
        elif self._key in _NAME_KEYS and not self.started:
            self._state = "name" if buf[pos] == '"' else "skip"
        else:
            self._state = "skip"
        return pos

    def _scan_value(self, buf: str, pos: int, final: bool) -> int:
        assert self._value is not None
        new = self._value.scan(buf, pos, final)
        piece = buf[pos:new]
        state = self._state
        if state == "args":
            self._args(piece)
        elif state in ("name", "args_string"):
            self._value_parts.append(piece)
        if self._value.error:
            return self._fail(new)
        if self._value.done:
            self._state = "after_value"
            if state == "name":
                self._name_done()
            elif state == "args_string":
                self._string_args_done()
        return new

    def _args(self, piece: str) -> None:
        if self.started:
            self.out.arguments(piece)
        else:
            self._pending_args.append(piece)

    def _name_done(self) -> None:
        try:
            name = orjson.loads("".join(self._value_parts))
        except orjson.JSONDecodeError:
            name = None
        if not isinstance(name, str) or not name:
            self.error = True
            return
        self.started = True
        self.out.start_call(name)
        self.out.arguments("".join(self._pending_args))
        self._pending_args = []

    def _string_args_done(self) -> None:
        try:
            text = orjson.loads("".join(self._value_parts))
        except orjson.JSONDecodeError:
            self.error = True
            return
        self._args(text if isinstance(text, str) else "")

    def _complete(self, pos: int) -> int:
        if not self.started:
            return self._fail(pos)
        if not self._args_seen:
            self.out.arguments("{}")
        self.done = True
        return pos


class AfterCallText:
    """Text between and after tool calls: whitespace-only runs are dropped, anything else is content.

    Whitespace is held until the next non-space character (then released with it) or until the next
    call or the end of the stream (then dropped), which is the same decision whatever the chunking.
    """

    def __init__(self, out: Emitter):
        self.out = out
        self.active = False
        self._held: list[str] = []

    def content(self, text: str) -> None:
        if not self.active:
            self.out.content(text)
            return
        if not text:
            return
        if text.isspace():
            self._held.append(text)
            return
        self.out.content("".join(self._held) + text)
        self._held = []
        self.active = False

    def call_starts(self) -> None:
        """A new call begins: held whitespace between calls is dropped."""
        self._held = []

    def after_call(self) -> None:
        self.active = True
        self._held = []
