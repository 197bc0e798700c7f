"""Anthropic bodies onto the mesh's chat request: the mapping, and a 400 naming the field for every bad input."""

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.anthropic.request import parse_count_tokens, parse_messages
from services.gateway.core.to_proto import chat_to_preprocess
from services.gateway.core.tools import tool_choice_proto

pytestmark = pytest.mark.unit

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**kw):
    return orjson.dumps({"model": "m", "max_tokens": 64, "messages": MSG, **kw})


def test_minimal_request_maps_to_one_user_message():
    req = parse_messages(body())
    assert req.model == "m" and req.n == 1 and not req.stream
    assert req.sampling.max_tokens == 64
    assert req.messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert req.tools is None and req.tool_choice is None and req.chat_template_kwargs == {}


def test_sampling_stop_sequences_and_bookkeeping_fields():
    req = parse_messages(body(temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["END", "\n\n"], stream=True,
                              metadata={"user_id": "u-1"}, service_tier="auto"))
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.stop) == (0.5, 0.9, 40, ["END", "\n\n"])
    assert req.stream
    proto = chat_to_preprocess(req, "rid").request
    assert list(proto.stop.stop) == ["END", "\n\n"] and proto.stop.max_tokens == 64
    assert proto.sampling.top_k == 40 and abs(proto.sampling.temperature - 0.5) < 1e-6


def test_system_string_and_blocks_become_a_system_message():
    assert parse_messages(body(system="Be brief.")).messages[0] == {"role": "system", "content": "Be brief."}
    req = parse_messages(body(system=[{"type": "text", "text": "One."},
                                      {"type": "text", "text": "Two.", "cache_control": {"type": "ephemeral"}}]))
    assert req.messages[0] == {"role": "system", "content": "One.\nTwo."}


def test_tool_round_trip_history_maps_to_openai_tool_calls_and_tool_messages():
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "call_2", "content": "timeout", "is_error": True},
            {"type": "text", "text": "And tomorrow?"}]},
    ]
    req = parse_messages(body(messages=history, tools=[TOOL]))
    assert req.messages[1] == {
        "role": "assistant", "content": "Let me check.", "reasoning_content": "I should call the tool.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                       {"id": "call_2", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]}
    assert req.messages[2:] == [{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                                {"role": "tool", "tool_call_id": "call_2", "content": "Error: timeout"},
                                {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}]
    assert req.tools == [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                           "parameters": TOOL["input_schema"]}}]


def test_assistant_with_only_tool_use_has_null_content():
    msgs = [*MSG, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather",
                                                     "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]
    req = parse_messages(body(messages=msgs, tools=[TOOL]))
    assert req.messages[1]["content"] is None
    assert req.messages[2] == {"role": "tool", "tool_call_id": "t", "content": ""}


@pytest.mark.parametrize("choice, expected, parallel", [
    ({"type": "auto"}, "auto", True),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ({"type": "any"}, "required", True),
    ({"type": "none"}, "none", True),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, True),
])
def test_tool_choice_mapping(choice, expected, parallel):
    req = parse_messages(body(tools=[TOOL], tool_choice=choice))
    assert req.tool_choice == expected and req.parallel_tool_calls is parallel
    prep = chat_to_preprocess(req, "rid")
    assert prep.tool_choice == tool_choice_proto(expected)
    forced = isinstance(expected, dict) or expected == "required"
    assert prep.request.sampling.HasField("guided_decoding") is forced


@pytest.mark.parametrize("thinking, kwargs, budget", [
    ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}, 1024),
    ({"type": "adaptive"}, {"enable_thinking": True}, None),
    ({"type": "disabled"}, {"enable_thinking": False}, None),
])
def test_thinking_maps_to_the_template_switch_and_its_budget_reaches_the_worker(thinking, kwargs, budget):
    req = parse_messages(body(max_tokens=2048, thinking=thinking))
    assert req.chat_template_kwargs == kwargs
    prep = chat_to_preprocess(req, "rid")
    assert orjson.loads(prep.chat_template_kwargs_json) == kwargs
    stop = prep.request.stop
    assert (stop.max_thinking_tokens if stop.HasField("max_thinking_tokens") else None) == budget


def test_output_config_and_top_level_cache_control():
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    req = parse_messages(body(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
                              cache_control={"type": "ephemeral", "ttl": "1h"}))
    assert req.response_format == {"type": "json_schema", "schema": schema}
    assert req.chat_template_kwargs == {"reasoning_effort": "low"}
    guided = chat_to_preprocess(req, "rid").request.sampling.guided_decoding
    assert orjson.loads(guided.json_schema) == schema


def test_count_tokens_takes_the_prompt_fields_only():
    req = parse_count_tokens(orjson.dumps({"model": "m", "messages": MSG, "system": "s", "tools": [TOOL],
                                           "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"}}))
    assert req.messages[0] == {"role": "system", "content": "s"} and req.tools
    with pytest.raises(InvalidRequest) as e:
        parse_count_tokens(orjson.dumps({"model": "m", "messages": MSG, "max_tokens": 5}))
    assert e.value.param == "max_tokens" and "max_tokens" in e.value.message


BAD = [
    ("invalid json", b"{nope", None),
    ("not an object", b"[1]", None),
    ("missing max_tokens", orjson.dumps({"model": "m", "messages": MSG}), "max_tokens"),
    ("max_tokens zero", body(max_tokens=0), "max_tokens"),
    ("max_tokens string", body(max_tokens="64"), "max_tokens"),
    ("missing model", orjson.dumps({"max_tokens": 5, "messages": MSG}), "model"),
    ("model wrong type", body(model=7), "model"),
    ("missing messages", orjson.dumps({"model": "m", "max_tokens": 5}), "messages"),
    ("messages wrong type", body(messages="hi"), "messages"),
    ("empty messages", body(messages=[]), "messages"),
    ("system role in messages", body(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
    ("missing content", body(messages=[{"role": "user"}]), "messages[0].content"),
    ("unknown message field", body(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
    ("content wrong type", body(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
    ("content empty array", body(messages=[{"role": "user", "content": []}]), "messages[0].content"),
    ("image block", body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
     "messages[0].content[0]"),
    ("text block without text", body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
     "messages[0].content[0].text"),
    ("unknown block field", body(messages=[{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]),
     "messages[0].content[0].y"),
    ("bad cache_control", body(system=[{"type": "text", "text": "x", "cache_control": {"type": "forever"}}]),
     "system[0].cache_control"),
    ("assistant prefill", body(messages=[*MSG, {"role": "assistant", "content": "The answer is"}]), "messages[1]"),
    ("tool_use input not object", body(messages=[
        *MSG, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}, *MSG]),
     "messages[1].content[0].input"),
    ("redacted thinking", body(messages=[
        *MSG, {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "..."}]}, *MSG]),
     "messages[1].content[0]"),
    ("system wrong type", body(system=5), "system"),
    ("temperature above 1", body(temperature=1.5), "temperature"),
    ("temperature string", body(temperature="hot"), "temperature"),
    ("top_p wrong type", body(top_p=[1]), "top_p"),
    ("top_k zero", body(top_k=0), "top_k"),
    ("stream not bool", body(stream="yes"), "stream"),
    ("stop_sequences not list", body(stop_sequences="END"), "stop_sequences"),
    ("empty stop sequence", body(stop_sequences=[""]), "stop_sequences"),
    ("metadata unknown key", body(metadata={"session": "x"}), "metadata.session"),
    ("unknown top-level field", body(frequency_penalty=1.0), "frequency_penalty"),
    ("server tool", body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0].type"),
    ("tool without schema", body(tools=[{"name": "f"}]), "tools[0].input_schema"),
    ("tool bad schema", body(tools=[{"name": "f", "input_schema": {"type": "object", "properties": 3}}]),
     "tools[0].input_schema"),
    ("tool bad name", body(tools=[{"name": "has space", "input_schema": {"type": "object"}}]), "tools[0].name"),
    ("tool defined twice", body(tools=[TOOL, TOOL]), "tools[1].name"),
    ("tool_choice string", body(tools=[TOOL], tool_choice="auto"), "tool_choice"),
    ("tool_choice bad type", body(tools=[TOOL], tool_choice={"type": "required"}), "tool_choice.type"),
    ("tool_choice unknown name", body(tools=[TOOL], tool_choice={"type": "tool", "name": "nope"}),
     "tool_choice.name"),
    ("tool_choice any without tools", body(tool_choice={"type": "any"}), "tool_choice"),
    ("thinking without budget", body(thinking={"type": "enabled"}), "thinking.budget_tokens"),
    ("thinking budget too small", body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 100}),
     "thinking.budget_tokens"),
    ("thinking budget not below max_tokens", body(max_tokens=2000, thinking={"type": "enabled",
                                                                             "budget_tokens": 2000}),
     "thinking.budget_tokens"),
    ("thinking bad type", body(thinking={"type": "sometimes"}), "thinking.type"),
    ("output_config effort max", body(output_config={"effort": "max"}), "output_config.effort"),
    ("output_config bad format type", body(output_config={"format": {"type": "regex", "schema": {}}}),
     "output_config.format.type"),
    ("output_config bad schema", body(output_config={"format": {"type": "json_schema", "schema": {"type": 1}}}),
     "output_config.format.schema"),
    ("output_config unknown field", body(output_config={"verbosity": "low"}), "output_config.verbosity"),
    ("top-level cache_control bad", body(cache_control={"type": "ephemeral", "ttl": "1d"}), "cache_control.ttl"),
    ("thinking unknown field", body(thinking={"type": "disabled", "budget_tokens": 1024}),
     "thinking.budget_tokens"),
]


@pytest.mark.parametrize("raw, param", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_requests_are_400_naming_the_field(raw, param):
    with pytest.raises(InvalidRequest) as e:
        parse_messages(raw)
    assert e.value.http_status == 400
    assert e.value.param == param
    if param is not None:
        assert param.split("[")[0].split(".")[0] in e.value.message
