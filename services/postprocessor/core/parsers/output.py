"""The postprocessor's output parsing for one sequence: reasoning split first, then tool calls.

``build_output_parser`` returns None when a request needs no parsing (no tools offered and no
reasoning parser), so plain requests carry no parser at all.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence

from services.postprocessor.core.parsers.reasoning import HARMONY, REASONING_PARSERS, MuseReasoningParser
from services.postprocessor.core.parsers.reasoning.think_tags import ThinkTagParser
from services.postprocessor.core.parsers.tool_calls import (
    TOOL_CALL_PARSERS,
    HarmonyParser,
    MuseToolParser,
    NamedToolParser,
    RequiredToolParser,
    XmlCallParser,
)
from services.postprocessor.core.parsers.tool_calls.kimi_k2 import KimiCallIds
from services.postprocessor.core.parsers.tool_calls.muse import tool_names
from services.postprocessor.core.parsers.tool_calls.param_types import ToolSchemas
from services.postprocessor.core.parsers.types import ParsedDelta, TextParser, concat, new_call_id


class ToolChoice(enum.StrEnum):
    """How the model may call the offered tools (the mesh's ToolChoiceMode, as the parsers name it)."""

    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"  # guided decoding forces an array of calls
    NAMED = "named"  # guided decoding forces the arguments of ``named_function``


@dataclasses.dataclass(frozen=True)
class ParserConfig:
    """What selects the parsers of one request.

    Attributes:
        tool_call_parser: the model's tool-call format (worker registration), "" for none.
        reasoning_parser: the model's reasoning format, "" for none.
        has_tools: the request offered tools.
        tool_choice: how the model may call them.
        named_function: the function when ``tool_choice`` is NAMED.
        prompt_opens_reasoning: the rendered prompt ends inside an opened reasoning block.
        thinking_disabled: the request turned thinking off (chat_template_kwargs).
        history_tool_calls: tool calls in the request's history (Kimi's call ids count on from it).
        forced_in_model_format: a structural tag forced REQUIRED / NAMED calls in the model's own format,
            so the model's parser reads them rather than the generic JSON forms.
    """

    tool_call_parser: str = ""
    reasoning_parser: str = ""
    has_tools: bool = False
    tool_choice: ToolChoice = ToolChoice.AUTO
    named_function: str = ""
    prompt_opens_reasoning: bool = False
    thinking_disabled: bool = False
    history_tool_calls: int = 0
    forced_in_model_format: bool = False


class OutputParser:
    """Feeds text through the reasoning parser, then its content through the tool-call parser."""

    def __init__(self, reasoning: TextParser | None, tools: TextParser | None, named: bool = False):
        assert reasoning is not None or tools is not None
        self._reasoning = reasoning
        self._tools = tools
        self._named = named

    @property
    def ends_with_tool_calls(self) -> bool:
        """A normal end becomes finish_reason ``tool_calls`` (not for a named tool_choice, as OpenAI does)."""
        return self.tool_calls > 0 and not self._named

    @property
    def tool_calls(self) -> int:
        """How many tool calls were started so far."""
        return sum(p.tool_calls for p in (self._reasoning, self._tools) if p is not None)

    def feed(self, text: str, ids: Sequence[int] = ()) -> ParsedDelta:
        """``ids`` (the generated ids of the step) are for engine backends (backends/); ours read text only."""
        if self._reasoning is None:
            return self._tools.feed(text)  # type: ignore[union-attr]
        first = self._reasoning.feed(text)
        if self._tools is None or not first.content:
            return first
        return _merge(first, self._tools.feed(first.content))

    def finish(self) -> ParsedDelta:
        if self._reasoning is None:
            return self._tools.finish()  # type: ignore[union-attr]
        first = self._reasoning.finish()
        if self._tools is None:
            return first
        second = self._tools.feed(first.content) if first.content else ParsedDelta()
        return _merge(first, concat(second, self._tools.finish()))


def _merge(reasoning: ParsedDelta, tools: ParsedDelta) -> ParsedDelta:
    return ParsedDelta(tools.content, reasoning.reasoning + tools.reasoning, reasoning.tool_calls + tools.tool_calls)


def _tool_parser(  # noqa: PLR0911 - one return per kind of parser
        cfg: ParserConfig, new_id: Callable[[], str], tools_json: str) -> TextParser | None:
    if not cfg.has_tools or cfg.tool_choice is ToolChoice.NONE:
        return None
    if not cfg.forced_in_model_format:
        if cfg.tool_choice is ToolChoice.NAMED:
            return NamedToolParser(cfg.named_function, new_id)
        if cfg.tool_choice is ToolChoice.REQUIRED:
            return RequiredToolParser(new_id)
    if not cfg.tool_call_parser:
        return None
    cls = TOOL_CALL_PARSERS.get(cfg.tool_call_parser)
    if cls is None:  # workers check the name at start (services/common/parser_names.py): a version skew
        raise LookupError(f"the worker registered tool-call parser {cfg.tool_call_parser!r}, "
                          "which this postprocessor does not know")
    if cls is MuseToolParser:  # reads Muse's channels too (reasoning, answer), as Dynamo's unified parser does
        return cls(new_id=new_id, names=tool_names(tools_json), thinking=not cfg.thinking_disabled,
                   prompt_opens_reasoning=cfg.prompt_opens_reasoning)
    if issubclass(cls, XmlCallParser):  # raw-text argument values: the tools' schemas give their JSON types
        return cls(new_id=new_id, schemas=ToolSchemas.from_json(tools_json))
    return cls(new_id=new_id)


def _reasoning_parser(cfg: ParserConfig, tools_in_harmony: bool,
                      new_id: Callable[[], str]) -> TextParser | None:
    name = cfg.reasoning_parser
    if not name or (cfg.thinking_disabled and name == HARMONY):
        return None
    if name == HARMONY:
        return HarmonyParser(tools_enabled=tools_in_harmony, new_id=new_id)
    cls = REASONING_PARSERS.get(name)
    if cls is None:  # workers check the name at start (services/common/parser_names.py): a version skew
        raise LookupError(f"the worker registered reasoning parser {name!r}, which this postprocessor does not know")
    if cls is MuseReasoningParser:  # its framing is read with thinking off too (self bodies are content then)
        return cls(prompt_opens_reasoning=cfg.prompt_opens_reasoning, thinking=not cfg.thinking_disabled)
    if cfg.thinking_disabled:
        # Thinking off (preprocessor/core/thinking.py): a format that starts in reasoning has none; one the
        # model must open still separates a block the model writes anyway, as Dynamo does (docs/parsers.md).
        return cls() if issubclass(cls, ThinkTagParser) and not cls.reasoning_first else None
    return cls(prompt_opens_reasoning=cfg.prompt_opens_reasoning)


def build_output_parser(cfg: ParserConfig, new_id: Callable[[], str] = new_call_id,
                        tools_json: str = "") -> OutputParser | None:
    """The parsers a request needs, or None when its output is plain content.

    ``tools_json`` is the request's ``tools`` (OpenAI JSON): formats whose argument values are raw
    text (``tool_calls/xml_calls.py``) read the parameters' types from it.
    """
    tools = _tool_parser(cfg, new_id, tools_json)
    if isinstance(tools, KimiCallIds):  # Kimi's ids count on from the history's calls
        tools.count_calls_from(cfg.history_tool_calls)
    harmony_tools = isinstance(tools, HarmonyParser)
    reasoning = _reasoning_parser(cfg, harmony_tools, new_id)
    if harmony_tools and isinstance(reasoning, HarmonyParser):
        tools = None  # one Harmony parser reads both channels and calls
    if isinstance(tools, MuseToolParser) and isinstance(reasoning, MuseReasoningParser):
        reasoning = None  # the tool-call parser splits the same channels (tool_calls/muse.py)
    if reasoning is None and tools is None:
        return None
    return OutputParser(reasoning, tools, named=cfg.has_tools and cfg.tool_choice is ToolChoice.NAMED)


class SingleToolCall:
    """``parallel_tool_calls: false``: passes a parser's first tool call and drops any later one.

    Works over any parser (ours or an engine backend's), because call indexes are assigned in order:
    the first call is index 0 in every delta that belongs to it.
    """

    def __init__(self, inner):
        self._inner = inner

    @staticmethod
    def _first_call_only(delta: ParsedDelta) -> ParsedDelta:
        if all(call.index == 0 for call in delta.tool_calls):
            return delta
        return ParsedDelta(delta.content, delta.reasoning, [c for c in delta.tool_calls if c.index == 0])

    def feed(self, text: str, ids: Sequence[int] = ()) -> ParsedDelta:
        return self._first_call_only(self._inner.feed(text, ids))

    def finish(self) -> ParsedDelta:
        return self._first_call_only(self._inner.finish())

    @property
    def tool_calls(self) -> int:
        return min(self._inner.tool_calls, 1)

    @property
    def ends_with_tool_calls(self) -> bool:
        return self._inner.ends_with_tool_calls
