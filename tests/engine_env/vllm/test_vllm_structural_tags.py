"""The structural tags the preprocessor builds (services/preprocessor/core/structural_tag.py), compiled by the
xgrammar vLLM ships: each format's tag accepts the model's own markup for a call with valid arguments and refuses
what the tag rules out, and what it accepts is what our parser for that format reads as the call."""

from __future__ import annotations

import itertools

import orjson
import pytest
import xgrammar as xgr
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from xgrammar.testing import _is_grammar_accept_string

from services.postprocessor.core.parsers import ParserConfig, build_output_parser
from services.preprocessor.core import structural_tag as st

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]

# One call of get_weather(city="Paris") in each format's markup (the engines' parser tests' shapes), and the same
# call with an argument the schema does not have.
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                   "</tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                   '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek_v3_1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  "</invoke>\n</minimax:tool_call>",
}
BAD = {"qwen3_coder": ("<parameter=city>", "<parameter=town>"),
       "minimax_m2": ('<parameter name="city">', '<parameter name="town">')}


def grammar(parser: str, choice: str, **kw) -> xgr.Grammar:
    tag = st.build(parser, TOOLS, choice, "get_weather", **kw)
    assert tag is not None
    return xgr.Grammar.from_structural_tag(orjson.dumps(tag).decode())


@pytest.mark.parametrize("parser", sorted(CALLS))
@pytest.mark.parametrize("choice", [st.AUTO, st.REQUIRED, st.NAMED])
def test_each_tag_accepts_the_models_call_and_refuses_wrong_arguments(parser, choice):
    g = grammar(parser, choice)
    call = CALLS[parser]
    assert _is_grammar_accept_string(g, call)
    old, new = BAD.get(parser, ('"city"', '"town"'))
    assert not _is_grammar_accept_string(g, call.replace(old, new).replace(old.replace("<", "</"), new.replace(
        "<", "</")))
    # text before the call: only auto leaves the model free to write it
    assert _is_grammar_accept_string(g, "Let me check. " + call) == (choice == st.AUTO)


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_parallel_calls_off_stops_after_one_and_an_open_reasoning_block_comes_first(parser):
    g = grammar(parser, st.REQUIRED, single_call=True, reasoning_open=True)
    assert _is_grammar_accept_string(g, "Paris, then.</think>" + CALLS[parser])
    two = CALLS[parser] + CALLS[parser]
    assert not _is_grammar_accept_string(g, "</think>" + two)


@pytest.mark.parametrize("parser", sorted(CALLS))
def test_what_the_tag_accepts_our_parser_reads_as_the_call(parser):
    counter = itertools.count()
    out = build_output_parser(ParserConfig(parser, has_tools=True), lambda: f"call_{next(counter)}",
                              orjson.dumps(TOOLS).decode())
    assert out is not None
    deltas = [out.feed(CALLS[parser]), out.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    assert calls[0].name == "get_weather"
    assert orjson.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}


def test_vllm_takes_the_tag_as_its_structured_outputs():
    tag = orjson.dumps(st.build("hermes", TOOLS, st.REQUIRED)).decode()
    params = SamplingParams(structured_outputs=StructuredOutputsParams(structural_tag=tag))
    assert params.structured_outputs is not None and params.structured_outputs.structural_tag == tag


def test_vllms_parser_reads_a_forced_call_in_the_models_format(oracle_model_dir):
    """--chat-processor vllm: vLLM's own hermes parser, fed token by token as the postprocessor feeds it."""
    from services.postprocessor.core.parsers import ToolChoice
    from services.postprocessor.core.parsers.backends import ParseContext, load_chat_processor
    from services.postprocessor.core.parsers.backends.vllm import _tokenizer
    from tests.engine_env.parser_oracle import token_stream

    config = ParserConfig("hermes", has_tools=True, tool_choice=ToolChoice.NAMED, named_function="get_weather",
                          forced_in_model_format=True)
    tokenizer = _tokenizer(str(oracle_model_dir))
    prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)  # vLLM's parsers read it
    parser = load_chat_processor("vllm").output_parser(
        config, ParseContext(str(oracle_model_dir), orjson.dumps(TOOLS).decode(), prompt))
    assert parser is not None
    steps = token_stream(tokenizer, CALLS["hermes"])
    deltas = [parser.feed(text, ids) for text, ids in steps] + [parser.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    assert calls[0].name == "get_weather"
    assert orjson.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    assert not parser.ends_with_tool_calls  # named: finish_reason stop, as OpenAI
