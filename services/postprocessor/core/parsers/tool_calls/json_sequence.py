"""A run of JSON call objects separated by ``,`` or ``;`` (optionally inside ``[`` … ``]``).

Shared by the llama3_json, mistral (list form) and ``tool_choice: required`` parsers.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.scan import AfterCallText, JsonCallReader, skip_ws
from services.postprocessor.core.parsers.types import Emitter


class JsonCallSequence:
    """Reads ``{call}`` objects separated by ``separators``; ``bracketed`` runs end at ``]``.

    ``consume`` returns the new position; ``done`` once the run ended (at ``]`` for a bracketed run,
    or at the first character that cannot continue it, which is left for the caller as content).
    A call object that is malformed ends the run too (``broken``).
    """

    def __init__(self, out: Emitter, text: AfterCallText, separators: str, bracketed: bool):
        self.out = out
        self._text = text
        self._separators = separators
        self._bracketed = bracketed
        self._reader: JsonCallReader | None = None
        self._expect_call = True
        self.done = False
        self.broken = False
        self.raw: list[str] = []  # text read while no call has started (shown if the run breaks)
        self.started = False  # a call of this run has started

    def consume(self, buf: str, pos: int, final: bool) -> int:
        while not self.done:
            if self._reader is not None:
                new = self._reader.consume(buf, pos, final)
                self._record(buf[pos:new])
                pos = new
                if self._reader.error:
                    self.done = self.broken = True
                    return pos
                if not self._reader.done:
                    return pos
                self._reader = None
                self._text.after_call()
                self._expect_call = False
                continue
            p = skip_ws(buf, pos)
            if p >= len(buf):
                if final:
                    self.done = True
                return pos
            c = buf[p]
            if c == "{" and self._expect_call:
                self._record(buf[pos:p])
                self._reader = JsonCallReader(self.out)
                self._text.call_starts()
                pos = p
            elif c in self._separators and not self._expect_call:
                self._record(buf[pos:p + 1])
                self._expect_call = True
                pos = p + 1
            elif c == "]" and self._bracketed:
                self._record(buf[pos:p + 1])
                self.done = True
                return p + 1
            else:
                self.done = True
                self.broken = self._bracketed
                return pos
        return pos

    def _record(self, text: str) -> None:
        if self.started:
            return
        if self._reader is not None and self._reader.started:
            self.started = True
            self.raw = []
        else:
            self.raw.append(text)
