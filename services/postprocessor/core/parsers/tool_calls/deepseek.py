"""DeepSeek V3 / R1 / V3.1 tool calls.

V3 and R1::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 puts the name before the separator and the bare JSON after it:
``<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>``. Both are read by
one parser: a header of ``function`` means the V3 layout. (The bars are U+FF5C, the spaces U+2581.)
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, ArgumentStream, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.types import TextParser, new_call_id

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_FENCES = ("```json", "```")


class DeepSeekToolParser(TextParser):
    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "content"
        self._text = AfterCallText(self.out)
        self._raw: list[str] = []
        self._header: list[str] = []
        self._arguments = ArgumentStream()

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            end, marker = find_marker(buf, pos, (CALLS_BEGIN, CALL_BEGIN), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._raw = [marker]
            self._state, self._pos = ("calls" if marker == CALLS_BEGIN else "header"), end + len(marker)
            self._header = []
            return True
        if state in ("header", "v3_name"):
            return self._read_header(buf, pos, final)
        if state == "args":
            return self._args(buf, pos, final)
        p = skip_ws(buf, pos)
        if state == "calls":
            return self._between_calls(buf, p, final)
        if state == "fence":
            return self._optional(buf, p, final, _FENCES, "args")
        if state == "after_args":
            return self._optional(buf, p, final, ("```",), "call_end")
        if not self._optional(buf, p, final, (CALL_END,), "calls"):  # state "call_end"
            return False
        self._text.after_call()
        return True

    def _between_calls(self, buf: str, p: int, final: bool) -> bool:
        for marker, state in ((CALL_BEGIN, "header"), (CALLS_END, "content")):
            verdict = expect(buf, p, marker, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._raw.append(buf[self._pos:p + len(marker)])
                self._state, self._pos, self._header = state, p + len(marker), []
                if state == "content":
                    self._finish_calls()
                return True
        if p == len(buf) and not final:
            return False
        self._finish_calls()
        self._state = "content"
        return True

    def _read_header(self, buf: str, pos: int, final: bool) -> bool:
        marker_set = (SEP,) if self._state == "header" else ("\n",)
        end, marker = find_marker(buf, pos, marker_set, final)
        self._header.append(buf[pos:end])
        self._raw.append(buf[pos:end] + (marker or ""))
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        text = "".join(self._header).strip()
        self._header = []
        if self._state == "header" and text == "function":
            self._state = "v3_name"
            return True
        if not text:
            self._show_raw()
            return True
        self.out.start_call(text)
        self._raw = []
        self._state = "fence" if self._state == "v3_name" else "args"
        self._arguments.reset()
        return True

    def _optional(self, buf: str, p: int, final: bool, literals: tuple[str, ...], then: str) -> bool:
        """Skips one of ``literals`` if it is at ``p`` (after whitespace), then moves to ``then``."""
        for literal in literals:
            verdict = expect(buf, p, literal, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._state, self._pos = then, p + len(literal)
                return True
        if p == len(buf) and not final:
            return False
        self._state = then
        return True

    def _args(self, buf: str, pos: int, final: bool) -> bool:
        self._pos, done = self._arguments.step(self.out, buf, pos, final)
        if not done:
            return False
        self._state = "after_args"
        return True

    def _show_raw(self) -> None:
        self._text.content("".join(self._raw))
        self._raw = []
        self._state = "content"

    def _finish_calls(self) -> None:
        self._raw = []
        self._text.after_call()

    def _end(self) -> None:
        if self._state in ("header", "v3_name") and self._raw:
            self._show_raw()
        self._text.call_starts()
