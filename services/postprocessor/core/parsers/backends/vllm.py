"""vLLM's own parsers behind our ``OutputParser`` interface (``--chat-processor vllm``).

Imported only when selected (``backends.load_chat_processor``): it imports vLLM at module level.
Each sequence gets one ``vllm.parser.Parser`` (vLLM's composition of a reasoning parser and a tool
parser, the object its OpenAI server holds per choice) driven through ``parse_delta`` with the text
*and* the generated ids of every step: vLLM's reasoning parsers decide on marker token ids.

What differs from our parsers is vLLM's behaviour, on purpose (that is why one selects it): e.g. it
does not trim whitespace around reasoning. Two things are ours: tool call ids (OpenAI-style
``call_…`` from ``new_id``, where vLLM makes ``chatcmpl-tool-…``) and the rule that a call starts
with its name (argument fragments that vLLM sends before the name are held until it comes).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import orjson

# Our workers constrain tool_choice required / named output to vLLM's generic JSON forms (an array
# of {name, parameters}; the function's arguments), not to each model's native call markup. vLLM
# parses those forms only with strict tool calling off (else it expects native markup produced by
# its structural tags): set it before vLLM reads its settings (an explicit setting wins).
os.environ.setdefault("VLLM_ENFORCE_STRICT_TOOL_CALLING", "0")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.tokenizers import get_tokenizer

from services.postprocessor.core.parsers.output import ParserConfig, ToolChoice
from services.postprocessor.core.parsers.types import ParsedDelta, ToolCallDelta, new_call_id

log = logging.getLogger(__name__)

# Our parser names (docs/parsers.md) -> vLLM's; a name not listed is vLLM's too (workers register
# only ours: services/common/parser_names.py).
TOOL_PARSER_NAMES = {
    "qwen": "hermes", "qwen25": "hermes", "qwen3": "hermes", "llama": "llama3_json",
    "deepseek_r1": "deepseek_v3", "deepseek_v3_1": "deepseek_v31", "harmony": "openai", "gpt_oss": "openai",
    # Dynamo's spellings (issue 37)
    "deepseek_v3_2": "deepseek_v32", "deepseek-v4": "deepseek_v4", "deepseekv4": "deepseek_v4", "kimi_k25": "kimi_k2",
    "kimi-k3": "kimi_k3", "minimax-m3": "minimax_m3", "minimax_m3_nom": "minimax_m3", "minimax-m3-nom": "minimax_m3",
    # Parsers II (issue 37); vLLM has no default / nemotron_deci (<TOOLCALL>) parser
    "gemma-4": "gemma4", "phi4": "phi4_mini_json", "nemotron_nano": "qwen3_coder",
    "muse": "muse_glimmer",  # SGLang's and Dynamo's other name for MuseGlimmer
}
REASONING_PARSER_NAMES = {"basic": "qwen3", "gpt_oss": "openai_gptoss", "harmony": "openai_gptoss",
                          "minimax": "minimax_m2", "nemotron": "nemotron_v3",
                          # Dynamo's names (issue 37). minimax_append_think is Dynamo's reasoning split, which
                          # is vLLM's minimax_m2 (its minimax_m2_append_think keeps everything as content).
                          "deepseek_v3_1": "deepseek_v3", "deepseek_v3_2": "deepseek_v3", "deepseek-v4": "deepseek_v4",
                          "deepseekv4": "deepseek_v4", "kimi_k25": "kimi_k2", "kimi-k3": "kimi_k3",
                          "minimax_append_think": "minimax_m2", "minimax-m3": "minimax_m3", "qwen3_coder": "qwen3",
                          # Parsers II (issue 37)
                          "gemma-4": "gemma4", "nemotron3": "nemotron_v3", "nemotron_nano": "nemotron_v3",
                          "nemotron_deci": "qwen3", "muse": "muse_glimmer"}
HARMONY_TOOL_PARSER = "openai"
# tool_choice required / named is handled by vLLM's Parser generically (not in the model's format),
# but only through a tool parser: this one carries it when the model registered none.
FORCED_CHOICE_CARRIER = "hermes"

# ParserManager.get_parser assigns class attributes of vLLM's HarmonyParser: serialize it.
_PARSER_CLASS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=16)
def _tokenizer(model_dir: str) -> Any:
    """vLLM's tokenizer for a model directory (loaded once: ~1 s for a 150k vocabulary)."""
    return get_tokenizer(model_dir)


@functools.lru_cache(maxsize=64)
def _parser_class(tool_parser: str, reasoning_parser: str, model_dir: str) -> Any:
    with _PARSER_CLASS_LOCK:
        return ParserManager.get_parser(
            tool_parser_name=tool_parser or None, reasoning_parser_name=reasoning_parser or None,
            enable_auto_tools=bool(tool_parser), is_harmony=tool_parser == HARMONY_TOOL_PARSER
            or reasoning_parser == REASONING_PARSER_NAMES["gpt_oss"], tokenizer=_tokenizer(model_dir))


def _vllm_names(config: ParserConfig) -> tuple[str, str]:
    """vLLM's (tool parser, reasoning parser) names for a request; "" for none."""
    tool = ""
    if config.has_tools and config.tool_choice is not ToolChoice.NONE:
        tool = TOOL_PARSER_NAMES.get(config.tool_call_parser, config.tool_call_parser)
        if not tool and config.tool_choice in (ToolChoice.REQUIRED, ToolChoice.NAMED):
            tool = FORCED_CHOICE_CARRIER
    reasoning = ""
    if config.reasoning_parser and not config.thinking_disabled:  # thinking off: no reasoning parser, as ours
        reasoning = REASONING_PARSER_NAMES.get(config.reasoning_parser, config.reasoning_parser)
    return tool, reasoning


def chat_request(tools_json: str, tool_choice: ToolChoice = ToolChoice.AUTO,
                 named_function: str = "") -> ChatCompletionRequest:
    """The vLLM request object its parsers read tools and tool_choice from (ParserConfig's choice)."""
    tools = orjson.loads(tools_json) if tools_json else None
    choice: Any = {"type": "function", "function": {"name": named_function}} if tool_choice is ToolChoice.NAMED \
        else tool_choice.value if tools else "none"
    return ChatCompletionRequest(model="meshfront", messages=[{"role": "user", "content": ""}],
                                 tools=tools, tool_choice=choice, include_reasoning=True)


class VllmOutputParser:
    """One sequence through a vLLM ``Parser``; the ``OutputParser`` interface."""

    def __init__(self, parser: Any, request: ChatCompletionRequest, prompt_ids: Sequence[int],
                 named: bool, new_id: Callable[[], str] = new_call_id):
        self._parser = parser
        self._request = request
        self._prompt_ids: list[int] | None = list(prompt_ids) or None  # handed over on the first step only
        self._named = named
        self._new_id = new_id
        self._held_ids: list[int] = []  # ids whose text the detokenizer or stop matcher still holds
        self._indices: dict[int, int] = {}  # vLLM's call index -> ours (calls that have a name)
        self._early_args: dict[int, str] = {}  # arguments vLLM sent before the call's name

    @property
    def tool_calls(self) -> int:
        return len(self._indices)

    @property
    def ends_with_tool_calls(self) -> bool:
        """As ours: a normal end becomes ``tool_calls``, except for a named tool_choice (as OpenAI)."""
        return self.tool_calls > 0 and not self._named

    def feed(self, text: str, ids: Sequence[int] = ()) -> ParsedDelta:
        self._held_ids.extend(ids)
        if not text:
            return ParsedDelta()
        return self._step(text, finished=False)

    def finish(self) -> ParsedDelta:
        return self._step("", finished=True)

    def _step(self, text: str, finished: bool) -> ParsedDelta:
        ids, self._held_ids = self._held_ids, []
        prompt_ids, self._prompt_ids = self._prompt_ids, None
        message = self._parser.parse_delta(text, ids, self._request, prompt_ids, finished=finished)
        return self._convert(message) if message is not None else ParsedDelta()

    def _convert(self, message: Any) -> ParsedDelta:
        """vLLM's ``DeltaMessage`` in our delta shape."""
        reasoning = getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None) or ""
        out = ParsedDelta(message.content or "", reasoning)
        for call in message.tool_calls or ():
            name = (call.function.name if call.function else None) or ""
            args = (call.function.arguments if call.function else None) or ""
            index = self._indices.get(call.index)
            if index is None and not name:
                self._early_args[call.index] = self._early_args.get(call.index, "") + args
                continue
            if index is None:
                index = self._indices[call.index] = len(self._indices)
                out.tool_calls.append(ToolCallDelta(index, self._new_id(), name,
                                                    self._early_args.pop(call.index, "") + args))
            elif args:
                out.tool_calls.append(ToolCallDelta(index, arguments=args))
        return out


class VllmChatProcessor:
    """``--chat-processor vllm``."""

    name = "vllm"

    def output_parser(self, config: ParserConfig, context: Any,
                      new_id: Callable[[], str] = new_call_id) -> VllmOutputParser | None:
        tool, reasoning = _vllm_names(config)
        if not tool and not reasoning:
            return None
        try:
            parser_cls = _parser_class(tool, reasoning, context.model_dir)
        except TypeError as e:  # vLLM's "has not been registered" / tokenizer mismatch
            log.warning("vLLM cannot parse with tool parser %r, reasoning parser %r: %s", tool, reasoning, e)
            return None
        if parser_cls is None:
            return None
        # A structural tag forced the calls in the model's own markup: vLLM's parser reads them as under auto.
        choice = ToolChoice.AUTO if config.forced_in_model_format else config.tool_choice
        request = chat_request(context.tools_json, choice, config.named_function) if tool else chat_request("")
        parser = parser_cls(_tokenizer(context.model_dir), request.tools)
        return VllmOutputParser(parser, request, context.prompt_ids, named=config.tool_choice is ToolChoice.NAMED,
                                new_id=new_id)


CHAT_PROCESSOR_CLASS = VllmChatProcessor
