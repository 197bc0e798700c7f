"""Reasoning parsers, one module per format, selected by name (the worker's ``--reasoning-parser``).

``gpt_oss`` is the Harmony parser (``tool_calls/harmony.py``): its channels carry reasoning and
tool calls together.
"""

from __future__ import annotations

from services.postprocessor.core.parsers.reasoning.deepseek_v3 import (
    DeepSeekV3ReasoningParser,
    DeepSeekV4ReasoningParser,
    DeepSeekV41ReasoningParser,
)
from services.postprocessor.core.parsers.reasoning.gemma4 import Gemma4ReasoningParser
from services.postprocessor.core.parsers.reasoning.granite import GraniteReasoningParser
from services.postprocessor.core.parsers.reasoning.inkling import InklingReasoningParser
from services.postprocessor.core.parsers.reasoning.kimi_k3 import KimiK3ReasoningParser
from services.postprocessor.core.parsers.reasoning.minimax_m3 import MiniMaxM3ReasoningParser
from services.postprocessor.core.parsers.reasoning.muse import MuseReasoningParser
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
    # Dynamo 1.6.1's names for these families (issue 37; docs/parsers.md says which format each is).
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "deepseek_v3_1": DeepSeekV3ReasoningParser,
    "deepseek_v3_2": DeepSeekV3ReasoningParser,
    "deepseek_v4": DeepSeekV4ReasoningParser,
    "deepseek-v4": DeepSeekV4ReasoningParser,
    "deepseekv4": DeepSeekV4ReasoningParser,
    "deepseek_v41": DeepSeekV41ReasoningParser,
    "kimi_k25": KimiK2ReasoningParser,
    "kimi_k3": KimiK3ReasoningParser,
    "kimi-k3": KimiK3ReasoningParser,
    "minimax_m2": MiniMaxReasoningParser,
    "minimax_append_think": MiniMaxReasoningParser,  # Dynamo prepends <think>: M2's reasoning-first split
    "minimax_m3": MiniMaxM3ReasoningParser,
    "minimax-m3": MiniMaxM3ReasoningParser,
    "glm47": Qwen3ReasoningParser,
    "qwen3_coder": Qwen3ReasoningParser,
    "step3": DeepSeekR1ReasoningParser,  # Step3's template opens <think>
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
    "inkling": InklingReasoningParser,
    "muse": MuseReasoningParser,
    "muse_glimmer": MuseReasoningParser,
    "granite": GraniteReasoningParser,
}
REASONING_NAMES = (*REASONING_PARSERS, HARMONY)

__all__ = ["HARMONY", "REASONING_NAMES", "REASONING_PARSERS", "MuseReasoningParser"]
