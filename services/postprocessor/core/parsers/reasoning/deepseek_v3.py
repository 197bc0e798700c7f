"""DeepSeek V3.1 / V3.2 / V4 / V4.1 reasoning: ``<think>`` … ``</think>``, opened by the prompt or the output.

These templates have a thinking and a chat mode (``thinking`` in chat_template_kwargs; chat is the
default of V3.1 and V3.2): in thinking mode the prompt ends with ``<think>``, in chat mode with
``</think>``. So the output is reasoning only when the prompt opened the block
(``prompt_opens_reasoning``) or the output opens it itself, never by default as R1's
(``deepseek_r1``) is. V4 and V4.1 may start their DSML tool-call block without closing the thinking
block: the block's opening marker ends the reasoning and is passed on to the tool-call parser.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.think_tags import ThinkTagParser


class DeepSeekV3ReasoningParser(ThinkTagParser):
    """``<think>`` … ``</think>`` when the prompt or the output opens it (deepseek_v3, deepseek_v3_1, deepseek_v3_2)."""


class DeepSeekV4ReasoningParser(ThinkTagParser):
    """As V3.x; ``<｜DSML｜tool_calls>`` also ends the reasoning (deepseek_v4, deepseek-v4, deepseekv4)."""

    content_starts = ("<｜DSML｜tool_calls>",)


class DeepSeekV41ReasoningParser(ThinkTagParser):
    """As V3.x; ``<｜DSML｜ calls>`` also ends the reasoning (deepseek_v41)."""

    content_starts = ("<｜DSML｜ calls>",)
