"""Structural tags (core/structural_tag.py) and when a request gets one (core/tool_guidance.py); Kimi's history
count. The tags' acceptance by xgrammar itself is tests/engine_env/vllm/test_vllm_structural_tags.py."""

from __future__ import annotations

import orjson
import pytest

from services.preprocessor.core import structural_tag as st
from services.preprocessor.core.tool_guidance import ToolRequest, history_tool_calls, structural_tag_json

pytestmark = pytest.mark.unit

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}, "strict": False}}]


def built(*args, **kw) -> dict:
    """The tag's format; the format has a shape."""
    tag = st.build(*args, **kw)
    assert tag is not None and tag["type"] == "structural_tag"
    return tag["format"]


def test_hermes_auto_is_free_text_until_a_call_of_an_offered_function():
    fmt = built("hermes", TOOLS, st.AUTO)
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"]
    assert fmt["stop_after_first"] is False
    begins = [t["begin"] for t in fmt["tags"]]
    assert begins == ['<tool_call>\n{"name": "get_weather", "arguments": ', '<tool_call>{"name": "get_weather", '
                      '"arguments": ', '<tool_call>\n{"name": "now", "arguments": ',
                      '<tool_call>{"name": "now", "arguments": ']
    assert fmt["tags"][0]["content"] == {"type": "json_schema", "json_schema": WEATHER, "style": "json"}
    assert fmt["tags"][2]["content"]["json_schema"] is True  # strict: false leaves the arguments free


def test_required_is_only_calls_and_named_only_that_function():
    required = built("qwen3_coder", TOOLS, st.REQUIRED, single_call=True)
    assert required["type"] == "tags_with_separator" and required["at_least_one"] and required["stop_after_first"]
    assert {t["content"]["style"] for t in required["tags"]} == {"qwen_xml"}
    named = built("qwen3_coder", TOOLS, st.NAMED, "now")
    assert [t["begin"] for t in named["tags"]] == ["<tool_call>\n<function=now>\n"]


def test_a_sectioned_format_wraps_its_calls_and_kimi_keeps_the_index():
    forced = built("kimi_k2", TOOLS, st.NAMED, "get_weather")
    assert forced["type"] == "sequence"
    first, calls, last = forced["elements"]
    assert (first["value"], last["value"]) == ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
    tag = calls["tags"][0]
    assert tag["begin"] == "<|tool_call_begin|>functions.get_weather" and tag["end"] == "<|tool_call_end|>"
    assert [e["type"] for e in tag["content"]["elements"]] == ["regex", "const_string", "json_schema"]
    auto = built("kimi_k2", TOOLS, st.AUTO)
    assert auto["triggers"] == ["<|tool_calls_section_begin|>"]
    section = auto["tags"][0]
    assert section["begin"] == "<|tool_calls_section_begin|>" and section["content"]["tags"][0] == tag
    assert len(section["content"]["tags"]) == 2


def test_schema_strict_holds_even_a_non_strict_tool_to_its_schema():
    fmt = built("llama3_json", TOOLS, st.NAMED, "now", schema_mode=st.SCHEMA_STRICT)
    assert fmt["tags"][0]["content"]["json_schema"] == {"type": "object"}


def test_an_open_reasoning_block_comes_first():
    fmt = built("hermes", TOOLS, st.REQUIRED, reasoning_open=True)
    reasoning, calls = fmt["elements"]
    assert reasoning == {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": "</think>"}
    assert calls["type"] == "tags_with_separator"


@pytest.mark.parametrize("parser", ["mistral", "pythonic", "glm47", "harmony", ""])
def test_formats_without_a_shape_get_no_tag(parser):
    assert st.build(parser, TOOLS, st.REQUIRED) is None


def request(choice: str = st.AUTO, **kw) -> ToolRequest:
    return ToolRequest(orjson.dumps(kw.pop("tools", TOOLS)).decode(), choice, **kw)


@pytest.mark.parametrize(("mode", "scope", "req", "tagged"), [
    ("off", "always", request(st.REQUIRED), False),
    ("on", "always", request("none"), False),
    ("on", "always", request(st.AUTO, client_constraint=True), False),  # the client's response_format wins
    ("on", "always", request(st.REQUIRED, client_constraint=True), True),  # over the gateway's JSON form
    ("on", "auto", request(st.AUTO), False),
    ("on", "auto", request(st.AUTO, single_call=True), True),
    ("on", "auto", request(st.AUTO, tools=[{"type": "function", "function": {"name": "f", "strict": True}}]), True),
    ("on", "auto", request(st.NAMED, named_function="now"), True),
    ("on", "always", request(st.AUTO), True),
])
def test_which_requests_get_a_tag_follows_dynamos_rule(mode, scope, req, tagged):
    tag = structural_tag_json("hermes", mode, scope, "auto", req)
    assert (tag is not None) == tagged
    if tag is not None:
        assert orjson.loads(tag)["type"] == "structural_tag"


def test_no_tools_or_an_unknown_format_gets_none():
    assert structural_tag_json("hermes", "on", "always", "auto", ToolRequest("", st.REQUIRED)) is None
    assert structural_tag_json("mistral", "on", "always", "auto", request(st.REQUIRED)) is None


def test_history_counts_the_assistants_tool_calls_only():
    call = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "tool_calls"},
                {"role": "assistant", "tool_calls": [call, call]},
                {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok", "tool_calls": [call]},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "assistant", "content": "no calls", "tool_calls": None}]
    assert history_tool_calls(orjson.dumps(messages).decode()) == 3
    assert history_tool_calls('[{"role": "user", "content": "hi"}]') == 0
