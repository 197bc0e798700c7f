"""Kimi K3 reasoning: the XTML ``think`` channel, ``<|open|>think<|sep|>`` … ``<|close|>think<|sep|>``.

K3 thinks by default (``thinking: false`` in chat_template_kwargs turns it off, and with it this
parser), and the serving template may already have opened the channel, so the output is reasoning
from its start; a repeated opening marker is skipped. The model may also leave the channel by
opening its ``response`` or ``tools`` channel without closing it: those end the reasoning and are
passed on. The response channel's wrappers are dropped from the content here, so a reply without
tools reads as plain text (``tool_calls/kimi_k3.py`` drops them too when there is no reasoning parser).
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.think_tags import ThinkTagParser
from services.postprocessor.core.parsers.tool_calls.kimi_k3 import (
    RESPONSE_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOLS_OPEN,
    ResponseWrappers,
)


class KimiK3ReasoningParser(ThinkTagParser):
    """``<|open|>think<|sep|>`` … ``<|close|>think<|sep|>``, reasoning first (kimi_k3)."""

    open_tag = THINK_OPEN
    close_tag = THINK_CLOSE
    reasoning_first = True
    content_starts = (RESPONSE_OPEN, TOOLS_OPEN)

    def __init__(self, prompt_opens_reasoning: bool = False):
        super().__init__(prompt_opens_reasoning)
        self._wrappers = ResponseWrappers()

    def _emit_content(self, text: str) -> None:
        super()._emit_content(self._wrappers.push(text))

    def _end(self) -> None:
        super()._end()
        super()._emit_content(self._wrappers.push("", final=True))
