"""Gemma 4 thinking: ``<|channel>thought\\n`` … ``<channel|>`` (names: gemma4, gemma-4).

Gemma 4 writes its chain of thought in a channel opened by ``<|channel>`` and closed by
``<channel|>`` (both special tokens); the channel's ``thought\\n`` role label is not reasoning and is
dropped. A channel may open anywhere in the output (thinking is opt-in per request, so the reply
usually starts as content); text around it is content. ``<|tool_call>`` inside an open channel ends
the reasoning too (the model went straight to a call) and is passed on, with what follows, to the
tool-call parser. A stray ``<channel|>`` outside a channel is dropped. Unlike the ``<think>``
formats, nothing is trimmed: Dynamo passes the text around the markers through as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from services.postprocessor.core.parsers.scan import expect, find_marker
from services.postprocessor.core.parsers.types import TextParser, new_call_id

CHANNEL_OPEN = "<|channel>"
CHANNEL_CLOSE = "<channel|>"
THOUGHT_LABEL = "thought\n"
TOOL_CALL_OPEN = "<|tool_call>"


class Gemma4ReasoningParser(TextParser):
    """Reasoning inside ``<|channel>`` … ``<channel|>`` spans, content elsewhere."""

    # The thinking budget forces the closing token (services/common/parser_names.py THINKING_BLOCKS).
    open_tag = CHANNEL_OPEN
    close_tag = CHANNEL_CLOSE
    open_tags: tuple[str, ...] = ()
    close_tags: tuple[str, ...] = ()

    def __init__(self, prompt_opens_reasoning: bool = False, new_id: Callable[[], str] = new_call_id):
        super().__init__(new_id)
        # A template that ends the prompt with ``<|channel>thought\n`` (after a tool response) continues inside it.
        self._state = "label" if prompt_opens_reasoning else "content"

    def _step(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if self._state == "content":
            end, marker = find_marker(buf, pos, (CHANNEL_OPEN, CHANNEL_CLOSE), final)
            self.out.content(buf[pos:end])
            self._pos = end + len(marker or "")
            if marker == CHANNEL_OPEN:
                self._state = "label"
            return marker is not None
        if self._state == "label":
            verdict = expect(buf, pos, THOUGHT_LABEL, final)
            if verdict == "wait":
                return False
            if verdict == "yes":
                self._pos = pos + len(THOUGHT_LABEL)
            self._state = "reasoning"
            return True
        end, marker = find_marker(buf, pos, (CHANNEL_CLOSE, TOOL_CALL_OPEN), final)
        self.out.reasoning(buf[pos:end])
        self._pos = end + (len(marker) if marker == CHANNEL_CLOSE else 0)
        if marker is None:
            return False
        self._state = "content"
        return True
