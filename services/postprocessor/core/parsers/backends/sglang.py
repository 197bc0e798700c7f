"""SGLang's own parsers behind our ``OutputParser`` interface (``--chat-processor sglang``).

Imported only when selected (``backends.load_chat_processor``): it imports SGLang at module level.
SGLang's streaming parsers read text only (``parse_stream_chunk``): its ``ReasoningParser`` splits
reasoning off, its ``FunctionCallParser`` finds calls in the rest, as its OpenAI server chains them.
Ids are ours (OpenAI-style ``call_…``), and tool_choice ``required`` / named use our parsers: our
workers constrain that output to a JSON form of ours, not to the model's native markup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser

from services.postprocessor.core.parsers.output import ParserConfig, ToolChoice, build_output_parser
from services.postprocessor.core.parsers.types import ParsedDelta, ToolCallDelta, new_call_id

log = logging.getLogger(__name__)

# Our parser names (docs/parsers.md) -> SGLang's; any other name is passed to SGLang as is.
TOOL_PARSER_NAMES = {
    "qwen": "qwen25", "qwen25": "qwen25", "qwen3": "qwen25", "llama3_json": "llama3", "llama": "llama3",
    "deepseek_v3": "deepseekv3", "deepseek_r1": "deepseekv3", "deepseek_v31": "deepseekv31",
    "deepseek_v3_1": "deepseekv31", "harmony": "gpt-oss", "gpt_oss": "gpt-oss", "deepseek_v32": "deepseekv32",
    "minimax_m2": "minimax-m2",
    # Dynamo's spellings (issue 37)
    "deepseek_v3_2": "deepseekv32", "deepseek_v4": "deepseekv4", "deepseek-v4": "deepseekv4",
    "deepseekv4": "deepseekv4",
    "deepseek_v41": "deepseekv41", "kimi_k25": "kimi_k2", "kimi-k3": "kimi_k3", "minimax_m3": "minimax-m3",
    "minimax_m3_nom": "minimax-m3", "minimax-m3-nom": "minimax-m3",
    # Parsers II (issue 37); SGLang has no default / nemotron_deci / jamba / phi4 parser
    "gemma-4": "gemma4", "nemotron_nano": "qwen3_coder",
    "muse_glimmer": "muse",  # vLLM's and Dynamo's other name for Muse Glimmer
}
REASONING_PARSER_NAMES = {"basic": "qwen3", "deepseek_r1": "deepseek-r1", "gpt_oss": "gpt-oss", "harmony": "gpt-oss",
                          "nemotron": "nemotron_3",
                          # Dynamo's names (issue 37)
                          "deepseek_v3": "deepseek-v3", "deepseek_v3_1": "deepseek-v3", "deepseek_v3_2": "deepseek-v3",
                          "deepseek_v4": "deepseek-v4", "deepseek-v4": "deepseek-v4", "deepseekv4": "deepseek-v4",
                          "deepseek_v41": "deepseek-v41", "kimi_k25": "kimi_k2", "kimi-k3": "kimi_k3",
                          "minimax_m2": "minimax", "minimax_append_think": "minimax-append-think",
                          "minimax_m3": "minimax-m3", "glm47": "glm45", "qwen3_coder": "qwen3",
                          # Parsers II (issue 37)
                          "gemma-4": "gemma4", "nemotron3": "nemotron_3", "nemotron_v3": "nemotron_3",
                          "nemotron_nano": "nemotron_3", "nemotron_deci": "qwen3", "muse_glimmer": "muse"}


class SglangOutputParser:
    """One sequence through SGLang's reasoning parser, then its function-call parser."""

    def __init__(self, reasoning: Any | None, tools: Any | None, new_id: Callable[[], str] = new_call_id):
        self._reasoning = reasoning
        self._tools = tools
        self._new_id = new_id
        self._indices: dict[int, int] = {}  # SGLang's tool_index -> ours (calls that have a name)
        self._early_args: dict[int, str] = {}
        self._tool_text: list[str] = []  # what went to the tool parser, for finish()
        self._names: list[str] = []  # per our index: the call's name and the arguments streamed so far
        self._sent_args: list[str] = []

    @property
    def tool_calls(self) -> int:
        return len(self._indices)

    @property
    def ends_with_tool_calls(self) -> bool:
        return self.tool_calls > 0

    def feed(self, text: str, ids: Sequence[int] = ()) -> ParsedDelta:
        if not text:
            return ParsedDelta()
        reasoning, content = "", text
        if self._reasoning is not None:
            reasoning, content = self._reasoning.parse_stream_chunk(text)
            reasoning, content = reasoning or "", content or ""
        out = ParsedDelta(content, reasoning)
        if self._tools is not None and content:
            self._tool_text.append(content)
            out.content, calls = self._tools.parse_stream_chunk(content)
            out.content = out.content or ""
            self._add_calls(out, calls)
        return out

    def finish(self) -> ParsedDelta:
        """The arguments of announced calls that SGLang's streaming detector parsed but never streamed.

        Its detector streams a call's arguments only while more text follows them: when the closing tag comes in
        the same chunk as the arguments (which depends on how a worker's tokens were batched: the mocker at
        speed, a speculative engine), they are dropped, and SGLang's own server then sends a call without
        arguments. Here SGLang's non-streaming parse of the whole text (what its server answers a
        non-streaming request with) supplies what is missing, call by call in order, for a call whose name and
        streamed arguments it agrees with; a call the streaming parse never announced is left as SGLang's
        streaming left it."""
        out = ParsedDelta()
        if self._tools is None or not self._indices:
            return out
        _normal, calls = self._tools.parse_non_stream("".join(self._tool_text))
        for index, call in enumerate(calls[:len(self._names)]):
            if call.name != self._names[index]:
                break
            expected, sent = call.parameters or "", self._sent_args[index]
            if expected.startswith(sent) and len(expected) > len(sent):
                out.tool_calls.append(ToolCallDelta(index, arguments=expected[len(sent):]))
        return out

    def _add_calls(self, out: ParsedDelta, calls: list[Any]) -> None:
        for call in calls:
            name, args = call.name or "", call.parameters or ""
            index = self._indices.get(call.tool_index)
            if index is None and not name:
                self._early_args[call.tool_index] = self._early_args.get(call.tool_index, "") + args
                continue
            if index is None:
                index = self._indices[call.tool_index] = len(self._indices)
                args = self._early_args.pop(call.tool_index, "") + args
                self._names.append(name)
                self._sent_args.append(args)
                out.tool_calls.append(ToolCallDelta(index, self._new_id(), name, args))
            elif args:
                self._sent_args[index] += args
                out.tool_calls.append(ToolCallDelta(index, arguments=args))


class SglangChatProcessor:
    """``--chat-processor sglang``."""

    name = "sglang"

    def output_parser(self, config: ParserConfig, context: Any,
                      new_id: Callable[[], str] = new_call_id) -> Any:
        if config.has_tools and config.tool_choice in (ToolChoice.REQUIRED, ToolChoice.NAMED):
            return build_output_parser(config, new_id, context.tools_json)  # ours (in the model's format too)
        reasoning = None
        if config.reasoning_parser and not config.thinking_disabled:
            name = REASONING_PARSER_NAMES.get(config.reasoning_parser, config.reasoning_parser)
            try:
                reasoning = ReasoningParser(name, stream_reasoning=True,
                                            force_reasoning=True if config.prompt_opens_reasoning else None)
            except ValueError as e:
                log.warning("SGLang has no reasoning parser %r: %s", name, e)
        tools = None
        if config.has_tools and config.tool_choice is ToolChoice.AUTO and config.tool_call_parser:
            name = TOOL_PARSER_NAMES.get(config.tool_call_parser, config.tool_call_parser)
            offered = [Tool(**t) for t in orjson.loads(context.tools_json or "[]")]
            try:
                tools = FunctionCallParser(offered, name)
            except (ValueError, KeyError) as e:
                log.warning("SGLang has no tool-call parser %r: %s", name, e)
        if reasoning is None and tools is None:
            return None
        return SglangOutputParser(reasoning, tools, new_id)


CHAT_PROCESSOR_CLASS = SglangChatProcessor
