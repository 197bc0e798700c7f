"""MiniMax M3 reasoning: ``<mm:think>`` … ``</mm:think>``.

M3's thinking is adaptive by default (the model decides whether to think) and forced with
``thinking_mode: "enabled"``, whose template opens the block in the prompt. So the output is reasoning
when it opens the block itself or the prompt did (``prompt_opens_reasoning``); a plain answer is
content (vLLM's and SGLang's ``minimax_m3`` parsers read it so).
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.think_tags import ThinkTagParser


class MiniMaxM3ReasoningParser(ThinkTagParser):
    """``<mm:think>`` … ``</mm:think>``, reasoning only when opened (minimax_m3, minimax-m3)."""

    open_tag = "<mm:think>"
    close_tag = "</mm:think>"
