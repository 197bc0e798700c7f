"""Reasoning parsers, one module per format, selected by name (the worker's ``--reasoning-parser``).

``gpt_oss`` is the Harmony parser (``tool_calls/harmony.py``): its channels carry reasoning and
tool calls together.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.gemma4 import Gemma4ReasoningParser
from services.postprocessor.core.parsers.reasoning.granite import GraniteReasoningParser
from services.postprocessor.core.parsers.reasoning.think_tags import (
    DeepSeekR1ReasoningParser,
    KimiK2ReasoningParser,
    KimiReasoningParser,
    MiniMaxReasoningParser,
    MistralReasoningParser,
    NemotronReasoningParser,
    Qwen3ReasoningParser,
)

HARMONY = "gpt_oss"
REASONING_PARSERS = {
    "basic": Qwen3ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "glm45": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "mistral": MistralReasoningParser,
    "kimi": KimiReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
    "minimax": MiniMaxReasoningParser,
    "nemotron": NemotronReasoningParser,
    # Dynamo's Nemotron names (issue 37): v3 and Nano open the block in the template; Deci only when opened.
    "nemotron3": NemotronReasoningParser,
    "nemotron_v3": NemotronReasoningParser,
    "nemotron_nano": NemotronReasoningParser,
    "nemotron_deci": Qwen3ReasoningParser,
    "gemma4": Gemma4ReasoningParser,
    "gemma-4": Gemma4ReasoningParser,
    "granite": GraniteReasoningParser,
}
REASONING_NAMES = (*REASONING_PARSERS, HARMONY)

__all__ = ["HARMONY", "REASONING_NAMES", "REASONING_PARSERS"]
