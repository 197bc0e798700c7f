"""How the postprocessor parses guided tool calls: a structural tag's forced calls in the model's format, and
--enable-auto-tool-choice (tool calls parsed from requests that offered no tools)."""

from __future__ import annotations

import pytest
from meshfront.common.v1 import common_pb2

from services.postprocessor.service import output_parser

pytestmark = pytest.mark.unit

TOOLS = '[{"type": "function", "function": {"name": "get_weather"}}]'
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REQUIRED = common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_REQUIRED)


def parse(parser, text: str) -> tuple[str, list[tuple[str, str]]]:
    deltas = [parser.feed(text), parser.finish()]
    calls = [(c.name, c.arguments) for d in deltas for c in d.tool_calls]
    return "".join(d.content for d in deltas), calls


def test_a_forced_choice_in_the_models_format_is_read_by_the_models_parser():
    options = common_pb2.PostprocessOptions(tool_call_parser="hermes", tools_json=TOOLS, tool_choice=REQUIRED,
                                            tool_calls_in_model_format=True)
    parser = output_parser(options)
    assert parser is not None
    assert parse(parser, HERMES_CALL) == ("", [("get_weather", '{"city": "Paris"}')])
    assert parser.ends_with_tool_calls


def test_a_forced_choice_in_json_form_is_still_read_as_json():
    options = common_pb2.PostprocessOptions(tool_call_parser="hermes", tools_json=TOOLS, tool_choice=REQUIRED)
    content, calls = parse(output_parser(options), '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    assert calls == [("get_weather", '{"city": "Oslo"}')]


def test_auto_tool_choice_parses_calls_without_tools_in_the_request():
    options = common_pb2.PostprocessOptions(tool_call_parser="hermes")
    assert output_parser(options) is None  # the default: no tools, no parsing
    assert parse(output_parser(options, auto_tool_choice=True), "Sure. " + HERMES_CALL) == (
        "Sure. ", [("get_weather", '{"city": "Paris"}')])
    none = common_pb2.PostprocessOptions(tool_call_parser="hermes",
                                         tool_choice=common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NONE))
    parser = output_parser(none, auto_tool_choice=True)
    assert parser is None or parse(parser, HERMES_CALL) == (HERMES_CALL, [])


def test_kimi_ids_continue_the_history_count():
    options = common_pb2.PostprocessOptions(tool_call_parser="kimi_k2", tools_json=TOOLS, history_tool_calls=4)
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_calls_section_end|>")
    parser = output_parser(options)
    assert parser is not None
    deltas = [parser.feed(text)]
    assert [c.id for d in deltas for c in d.tool_calls] == ["functions.get_weather:4"]
