"""Mistral tool calls, both forms.

- v0.3 tokenizers (Mistral 7B v0.3, Mixtral, Nemo): ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.
- v11+ tokenizers (Mistral Small 3.2, Magistral, Devstral): ``[TOOL_CALLS]name[ARGS]{...}``, repeated
  for several calls; an optional ``[CALL_ID]id`` before ``[ARGS]`` is skipped (ids are ours).

Text before the first ``[TOOL_CALLS]`` is content.
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, ArgumentStream, find_marker, skip_ws
from services.postprocessor.core.parsers.tool_calls.json_sequence import JsonCallSequence
from services.postprocessor.core.parsers.types import TextParser, new_call_id

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralToolParser(TextParser):
    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "content"
        self._text = AfterCallText(self.out)
        self._seq: JsonCallSequence | None = None
        self._raw: list[str] = []
        self._name: list[str] = []
        self._arguments = ArgumentStream()

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one branch per state
        buf, pos = self._buf, self._pos
        state = self._state
        if state == "content":
            end, marker = find_marker(buf, pos, (TOOL_CALLS,), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._raw, self._name = [marker], []
            self._state, self._pos = "after_tag", end + len(marker)
            return True
        if state == "after_tag":
            p = skip_ws(buf, pos)
            if p == len(buf):
                return False
            if buf[p] == "[":
                self._raw.append(buf[pos:p + 1])
                self._seq = JsonCallSequence(self.out, self._text, separators=",", bracketed=True)
                self._state, self._pos = "list", p + 1
            else:
                self._state = "name"
            return True
        if state == "list":
            return self._list(buf, pos, final)
        if state in ("name", "call_id"):
            return self._header(buf, pos, final)
        return self._args(buf, pos, final)

    def _list(self, buf: str, pos: int, final: bool) -> bool:
        seq = self._seq
        assert seq is not None
        self._pos = seq.consume(buf, pos, final)
        if not seq.done:
            return False
        if seq.broken and not seq.started:
            self._text.content("".join(self._raw + seq.raw))
        self._seq, self._state = None, "content"
        return True

    def _header(self, buf: str, pos: int, final: bool) -> bool:
        markers = (ARGS, CALL_ID) if self._state == "name" else (ARGS,)
        end, marker = find_marker(buf, pos, markers, final)
        self._raw.append(buf[pos:end] + (marker or ""))
        if self._state == "name":
            self._name.append(buf[pos:end])
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        if marker == CALL_ID:
            self._state = "call_id"
            return True
        name = "".join(self._name).strip()
        if not name:
            self._text.content("".join(self._raw))
            self._state = "content"
            return True
        self.out.start_call(name)
        self._state = "args"
        self._arguments.reset()
        return True

    def _args(self, buf: str, pos: int, final: bool) -> bool:
        self._pos, done = self._arguments.step(self.out, buf, pos, final)
        if not done:
            return False
        self._state = "content"
        self._text.after_call()
        return True

    def _end(self) -> None:
        if self._state in ("after_tag", "name", "call_id"):
            self._text.content("".join(self._raw))
        elif self._state == "list" and self._seq is not None and not self._seq.started:
            self._text.content("".join(self._raw + self._seq.raw))
        self._text.call_starts()
