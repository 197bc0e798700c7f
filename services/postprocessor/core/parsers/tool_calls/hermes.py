"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number.

Qwen2.5, Qwen3, Hermes 2/3 and many fine-tunes emit this. Text before, between and after the blocks
is content (whitespace-only runs between calls are dropped). A block whose JSON is malformed before
the function name is known is shown as plain text, markers included; one that breaks after the call
started keeps what was streamed and skips to ``</tool_call>``. A missing ``</tool_call>`` is tolerated.
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.scan import AfterCallText, JsonCallReader, expect, find_marker, skip_ws
from services.postprocessor.core.parsers.types import TextParser, new_call_id


class TaggedJsonToolParser(TextParser):
    """JSON call objects between a start and an end tag."""

    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "content"
        self._text = AfterCallText(self.out)
        self._reader: JsonCallReader | None = None
        self._raw: list[str] = []  # the block's text while no call has started (shown if it fails)

    def _step(self, final: bool) -> bool:  # noqa: PLR0911 - one return per state of the scanner
        buf, pos = self._buf, self._pos
        if self._state == "content":
            end, marker = find_marker(buf, pos, (self.start_tag,), final)
            self._text.content(buf[pos:end])
            self._pos = end
            if marker is None:
                return False
            self._text.call_starts()
            self._open_block(end + len(marker))
            return True
        if self._state == "block":
            return self._read_block(buf, pos, final)
        if self._state == "close":
            p = skip_ws(buf, pos)
            verdict = expect(buf, p, self.end_tag, final)
            if verdict == "wait" or (p == len(buf) and not final):
                return False
            self._pos = p + len(self.end_tag) if verdict == "yes" else pos
            self._close_block()
            return True
        # "skip": a block that broke; drop text up to the end tag.
        end, marker = find_marker(buf, pos, (self.end_tag,), final)
        self._record(buf[pos:end] + (marker or ""))
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        self._close_block()
        return True

    def _open_block(self, pos: int) -> None:
        self._state = "block"
        self._reader = JsonCallReader(self.out)
        self._raw = [self.start_tag]
        self._pos = pos

    def _read_block(self, buf: str, pos: int, final: bool) -> bool:
        reader = self._reader
        assert reader is not None
        new = reader.consume(buf, pos, final)
        self._record(buf[pos:new])
        self._pos = new
        if reader.done:
            self._state = "close"
            return True
        if reader.error:
            self._state = "skip"
            return True
        return False

    def _record(self, text: str) -> None:
        if not (self._reader and self._reader.started):
            self._raw.append(text)

    def _close_block(self) -> None:
        started = self._reader is not None and self._reader.started
        if not started:
            self._text.content("".join(self._raw))
        self._raw = []
        self._reader = None
        self._state = "content"
        if started:
            self._text.after_call()

    def _end(self) -> None:
        if self._state in ("block", "skip", "close"):
            self._close_block()
        self._text.call_starts()  # whitespace after the last call is dropped


class HermesToolParser(TaggedJsonToolParser):
    """``<tool_call>`` … ``</tool_call>`` (names: hermes, qwen, qwen25, qwen3)."""
