"""Tool-call parsers, one module per format, selected by name (the worker's ``--tool-call-parser``)."""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.deepseek import DeepSeekToolParser
from services.postprocessor.core.parsers.tool_calls.deepseek_v4 import DeepSeekV4ToolParser
from services.postprocessor.core.parsers.tool_calls.deepseek_v32 import DeepSeekV32ToolParser
from services.postprocessor.core.parsers.tool_calls.deepseek_v41 import DeepSeekV41ToolParser
from services.postprocessor.core.parsers.tool_calls.dynamo_default import DynamoDefaultToolParser
from services.postprocessor.core.parsers.tool_calls.forced import NamedToolParser, RequiredToolParser
from services.postprocessor.core.parsers.tool_calls.gemma4 import Gemma4ToolParser
from services.postprocessor.core.parsers.tool_calls.glm import GlmToolParser
from services.postprocessor.core.parsers.tool_calls.harmony import HarmonyParser
from services.postprocessor.core.parsers.tool_calls.hermes import HermesToolParser
from services.postprocessor.core.parsers.tool_calls.inkling import InklingToolParser
from services.postprocessor.core.parsers.tool_calls.jamba import JambaToolParser
from services.postprocessor.core.parsers.tool_calls.kimi_k2 import KimiK2ToolParser
from services.postprocessor.core.parsers.tool_calls.kimi_k3 import KimiK3ToolParser
from services.postprocessor.core.parsers.tool_calls.llama3_json import Llama3JsonToolParser
from services.postprocessor.core.parsers.tool_calls.minimax_m2 import MiniMaxM2ToolParser
from services.postprocessor.core.parsers.tool_calls.minimax_m3 import MiniMaxM3ToolParser
from services.postprocessor.core.parsers.tool_calls.mistral import MistralToolParser
from services.postprocessor.core.parsers.tool_calls.muse import MuseToolParser
from services.postprocessor.core.parsers.tool_calls.nemotron_deci import NemotronDeciToolParser
from services.postprocessor.core.parsers.tool_calls.phi4 import Phi4ToolParser
from services.postprocessor.core.parsers.tool_calls.pythonic import PythonicToolParser
from services.postprocessor.core.parsers.tool_calls.qwen3_coder import Qwen3CoderToolParser
from services.postprocessor.core.parsers.tool_calls.xml_calls import XmlCallParser
from services.postprocessor.core.parsers.types import TextParser

# Name -> parser class; the aliases follow the names vLLM, SGLang and Dynamo use.
TOOL_CALL_PARSERS: dict[str, type[TextParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "qwen25": HermesToolParser,
    "qwen3": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,
    "deepseek_v3": DeepSeekToolParser,
    "deepseek_v3_1": DeepSeekToolParser,
    "deepseek_v31": DeepSeekToolParser,
    "deepseek_r1": DeepSeekToolParser,
    "deepseek_v32": DeepSeekV32ToolParser,
    "deepseek_v3_2": DeepSeekV32ToolParser,  # Dynamo's spelling
    "deepseek_v4": DeepSeekV4ToolParser,
    "deepseek-v4": DeepSeekV4ToolParser,
    "deepseekv4": DeepSeekV4ToolParser,
    "deepseek_v41": DeepSeekV41ToolParser,
    "harmony": HarmonyParser,
    "gpt_oss": HarmonyParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "kimi_k2": KimiK2ToolParser,
    "kimi_k25": KimiK2ToolParser,  # K2.5 writes K2's section
    "kimi_k3": KimiK3ToolParser,
    "kimi-k3": KimiK3ToolParser,
    "glm45": GlmToolParser,
    "glm47": GlmToolParser,
    "minimax_m2": MiniMaxM2ToolParser,
    "minimax_m3": MiniMaxM3ToolParser,
    "minimax-m3": MiniMaxM3ToolParser,
    "minimax_m3_nom": MiniMaxM3ToolParser,
    "minimax-m3-nom": MiniMaxM3ToolParser,
    # Parsers II (issue 37): Dynamo's default, Nemotron, Phi-4, Jamba (docs/parsers.md).
    "default": DynamoDefaultToolParser,
    "nemotron_deci": NemotronDeciToolParser,
    "nemotron_nano": Qwen3CoderToolParser,  # Nemotron Nano v2/v3 write Qwen3-Coder's XML calls
    "phi4": Phi4ToolParser,
    "jamba": JambaToolParser,
    "gemma4": Gemma4ToolParser,
    "gemma-4": Gemma4ToolParser,
    "inkling": InklingToolParser,
    "muse": MuseToolParser,  # SGLang's name
    "muse_glimmer": MuseToolParser,  # vLLM's
}

__all__ = ["TOOL_CALL_PARSERS", "HarmonyParser", "MuseToolParser", "NamedToolParser", "RequiredToolParser",
           "XmlCallParser"]
