"""Inkling reasoning: ``<|content_thinking|>`` blocks are reasoning, text blocks content (name: inkling).

The block grammar is in ``core/parsers/inkling_blocks.py``. This parser keeps the markers of a JSON
tool block (``<|content_invoke_tool_json|>`` … ``<|end_message|>``) in the content it passes on, so
the tool-call parser (``tool_calls/inkling.py``) reads the call; every other marker, and a header's
function name, is dropped. A tool block also ends an unclosed thinking block. Trailing whitespace of
the reasoning is trimmed (the model ends a thought with a newline before ``<|end_message|>``).
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.inkling_blocks import (
    BLOCK_ENDS,
    CONTENT_THINKING,
    CONTENT_TOOL_JSON,
    MARKERS,
    MESSAGE_MODEL,
)
from services.postprocessor.core.parsers.scan import find_marker
from services.postprocessor.core.parsers.types import TextParser, new_call_id


class InklingReasoningParser(TextParser):
    """Splits Inkling's blocks: thinking → reasoning, visible blocks → content, tool blocks passed on whole."""

    # Several markers close a thought, so the thinking budget has no single token to force (THINKING_BLOCKS).
    open_tags = (CONTENT_THINKING,)
    close_tags = BLOCK_ENDS

    def __init__(self, prompt_opens_reasoning: bool = False, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        self._state = "thinking" if prompt_opens_reasoning else "header"
        self._seen_marker = False  # header text before any marker at all is a plain answer
        self._held_ws = ""  # reasoning's trailing whitespace, released if more reasoning follows

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        state = self._state
        markers = BLOCK_ENDS if state == "tool" else MARKERS
        end, marker = find_marker(buf, pos, markers, final)
        text = buf[pos:end]
        if state == "thinking":
            self._reasoning(text)
        elif state in ("text", "tool") or not self._seen_marker:
            self.out.content(text)
        self._pos = end + len(marker or "")
        if marker is None:
            return False
        self._seen_marker = True
        self._state = self._next(state, marker)
        if state == "thinking" and self._state != "thinking":
            self._held_ws = ""
        return True

    def _next(self, state: str, marker: str) -> str:
        if state == "tool":  # the block's end goes to the tool-call parser with the block
            self.out.content(marker)
            return "text"
        if marker == MESSAGE_MODEL:
            return "header"
        if marker == CONTENT_THINKING:
            return "thinking"
        if marker == CONTENT_TOOL_JSON:
            self.out.content(marker)
            return "tool"
        return "text"  # a block's end, or a visible block

    def _reasoning(self, text: str) -> None:
        if not text:
            return
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body):]
        self.out.reasoning(body)
