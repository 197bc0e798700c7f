"""The postprocessor's parser choice from PostprocessOptions (services/postprocessor/convert.py).

Tools offered is a boolean the gateway's non-empty ``tools_json`` already says; the tool choice is the
mesh's enum, one ``ToolChoice`` per mode."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2

from services.postprocessor import convert
from services.postprocessor.core.parsers import ParserConfig, ToolChoice

pytestmark = pytest.mark.unit

TOOLS = '[{"type": "function", "function": {"name": "f"}}]'


@pytest.mark.parametrize(("mode", "choice"), [
    (common_pb2.TOOL_CHOICE_MODE_UNSPECIFIED, ToolChoice.AUTO), (common_pb2.TOOL_CHOICE_MODE_AUTO, ToolChoice.AUTO),
    (common_pb2.TOOL_CHOICE_MODE_NONE, ToolChoice.NONE), (common_pb2.TOOL_CHOICE_MODE_REQUIRED, ToolChoice.REQUIRED),
    (common_pb2.TOOL_CHOICE_MODE_NAMED, ToolChoice.NAMED)])
def test_every_tool_choice_mode_has_its_enum(mode, choice):
    options = common_pb2.PostprocessOptions(tool_call_parser="hermes", tools_json=TOOLS,
                                            tool_choice=common_pb2.ToolChoice(mode=mode, function_name="f"))
    assert convert.parser_config(options) == ParserConfig("hermes", has_tools=True, tool_choice=choice,
                                                          named_function="f")


def test_tools_offered_is_read_without_decoding_them():
    # Not JSON at all: the postprocessor no longer parses the tools to learn that there are some (the
    # gateway validated them; a backend parser that needs them decodes them itself).
    assert convert.parser_config(common_pb2.PostprocessOptions(tools_json="[not json")).has_tools
    config = convert.parser_config(common_pb2.PostprocessOptions(reasoning_parser="qwen3", thinking_disabled=True,
                                                                 prompt_opens_reasoning=True))
    assert config == ParserConfig(reasoning_parser="qwen3", prompt_opens_reasoning=True, thinking_disabled=True)
    assert not config.has_tools and config.tool_choice is ToolChoice.AUTO
