"""Tool-call parsers, one module per format, selected by name (the worker's ``--tool-call-parser``)."""

from __future__ import annotations

from services.postprocessor.core.parsers.tool_calls.deepseek import DeepSeekToolParser
from services.postprocessor.core.parsers.tool_calls.forced import NamedToolParser, RequiredToolParser
from services.postprocessor.core.parsers.tool_calls.harmony import HarmonyParser
from services.postprocessor.core.parsers.tool_calls.hermes import HermesToolParser
from services.postprocessor.core.parsers.tool_calls.llama3_json import Llama3JsonToolParser
from services.postprocessor.core.parsers.tool_calls.mistral import MistralToolParser
from services.postprocessor.core.parsers.tool_calls.pythonic import PythonicToolParser

# Name -> parser class; the aliases follow the names vLLM, SGLang and Dynamo use.
TOOL_CALL_PARSERS = {
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
    "harmony": HarmonyParser,
    "gpt_oss": HarmonyParser,
}

__all__ = ["TOOL_CALL_PARSERS", "HarmonyParser", "NamedToolParser", "RequiredToolParser"]
