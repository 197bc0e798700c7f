"""Responses API bodies: every bad input is a 400 naming the field; good ones map onto the chat path."""

import orjson
import pytest
from meshfront.common.v1 import common_pb2

from services.common.errors import InvalidRequest
from services.gateway.core.to_proto import chat_to_preprocess, postprocess_options
from services.gateway.responses_api.conversation import output_as_input, to_chat, to_messages
from services.gateway.responses_api.request import parse_responses

pytestmark = pytest.mark.unit

TOOL = {"type": "function", "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**kw):
    return orjson.dumps({"model": "m", "input": "hi", **kw})


BAD = [
    ("invalid json", b"{nope", None),
    ("missing input", orjson.dumps({"model": "m"}), "input"),
    ("missing model", orjson.dumps({"input": "hi"}), "model"),
    ("empty input string", body(input=""), "input"),
    ("empty input list", body(input=[]), "input"),
    ("input number", body(input=3), "input"),
    ("item not object", body(input=["hi"]), "input[0]"),
    ("bad role", body(input=[{"role": "robot", "content": "x"}]), "input[0].role"),
    ("image part", body(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]),
     "input[0].content[0].type"),
    ("file part", body(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
     "input[0].content[0].type"),
    ("part without text", body(input=[{"role": "user", "content": [{"type": "input_text"}]}]),
     "input[0].content[0].text"),
    ("unknown part field", body(input=[{"role": "user", "content": [{"type": "input_text", "text": "a", "x": 1}]}]),
     "input[0].content[0].x"),
    ("unknown item type", body(input=[{"type": "web_search_call", "id": "ws"}]), "input[0].type"),
    ("item reference", body(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
    ("unknown item field", body(input=[{"role": "user", "content": "a", "colour": "red"}]), "input[0].colour"),
    ("function_call without call_id", body(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
     "input[0].call_id"),
    ("function_call_output bad output", body(input=[{"type": "function_call_output", "call_id": "c", "output": 3}]),
     "input[0].output"),
    ("encrypted reasoning", body(input=[{"type": "reasoning", "summary": [], "encrypted_content": "zz"}]),
     "input[0].encrypted_content"),
    ("web_search tool", body(tools=[{"type": "web_search"}]), "tools[0].type"),
    ("file_search tool", body(tools=[{"type": "file_search", "vector_store_ids": ["v"]}]), "tools[0].type"),
    ("code_interpreter tool", body(tools=[{"type": "code_interpreter", "container": {"type": "auto"}}]),
     "tools[0].type"),
    ("bad function name", body(tools=[{**TOOL, "name": "has space"}]), "tools[0].name"),
    ("duplicate function", body(tools=[TOOL, TOOL]), "tools[1].name"),
    ("bad parameters schema", body(tools=[{**TOOL, "parameters": {"type": "nope"}}]), "tools[0].parameters"),
    ("chat-shaped tool", body(tools=[{"type": "function", "function": {"name": "f"}}]), "tools[0].name"),
    ("unknown tool field", body(tools=[{**TOOL, "colour": 1}]), "tools[0].colour"),
    ("tool_choice unknown function", body(tools=[TOOL], tool_choice={"type": "function", "name": "nope"}),
     "tool_choice"),
    ("tool_choice required without tools", body(tool_choice="required"), "tool_choice"),
    ("tool_choice built-in", body(tool_choice={"type": "web_search_preview"}), "tool_choice.type"),
    ("background", body(background=True), "background"),
    ("prompt template", body(prompt={"id": "pmpt_1"}), "prompt"),
    ("conversation", body(conversation="conv_1"), "conversation"),
    ("include", body(include=["reasoning.encrypted_content"]), "include"),
    ("max_output_tokens zero", body(max_output_tokens=0), "max_output_tokens"),
    ("temperature high", body(temperature=3), "temperature"),
    ("top_p high", body(top_p=1.5), "top_p"),
    ("text format type", body(text={"format": {"type": "yaml"}}), "text.format.type"),
    ("json_schema without name", body(text={"format": {"type": "json_schema", "schema": {"type": "object"}}}),
     "text.format.name"),
    ("json_schema without schema", body(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),
    ("json_schema bad schema", body(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}),
     "text.format.schema"),
    ("text verbosity", body(text={"verbosity": "low"}), "text.verbosity"),
    ("reasoning effort", body(reasoning={"effort": "extreme"}), "reasoning.effort"),
    ("reasoning summary", body(reasoning={"summary": "auto"}), "reasoning.summary"),
    ("truncation auto", body(truncation="auto"), "truncation"),
    ("metadata not string", body(metadata={"k": 1}), "metadata.k"),
    ("empty previous id", body(previous_response_id=""), "previous_response_id"),
    ("100 KB previous id", body(previous_response_id="resp_" + "x" * 100_000), "previous_response_id"),
    ("unknown field", body(frobnicate=True), "frobnicate"),
    ("stream not bool", body(stream="yes"), "stream"),
    ("store not bool", body(store="no"), "store"),
]


@pytest.mark.parametrize("name,raw,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_400_naming_the_field(name, raw, param):
    with pytest.raises(InvalidRequest) as e:
        parse_responses(raw)
    assert e.value.http_status == 400
    assert e.value.param == param, e.value.message


def test_string_input_is_one_user_message_and_defaults():
    req = parse_responses(body())
    assert req.items == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    assert req.store is True and req.stream is False and req.tool_choice == "auto" and req.parallel_tool_calls
    assert req.text_format == {"type": "text"} and req.previous_response_id is None


def test_items_are_normalized():
    req = parse_responses(body(input=[
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "c", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}",
         "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "42"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}]},
    ]))
    assert req.items[0] == {"type": "message", "role": "developer",
                            "content": [{"type": "input_text", "text": "be brief"}]}
    assert req.items[2]["content"] == [{"type": "output_text", "text": "c"}]
    assert req.items[3] == {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    assert req.items[4] == {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    assert req.items[5]["summary"] == [{"type": "summary_text", "text": "s"}]


def test_items_become_chat_turns():
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "rain"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris wins"}]},
        {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
    ]
    assert to_messages(items, "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Paris wins", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    ]


def test_output_items_feed_the_next_turn():
    output = [
        {"id": "rs_1", "type": "reasoning", "status": "completed", "summary": [],
         "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_9", "name": "f",
         "arguments": "{}"},
    ]
    assert to_messages(output_as_input(output)) == [
        {"role": "assistant", "content": "hello", "reasoning_content": "hmm", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


def test_request_maps_onto_the_chat_proto():
    named = {"type": "function", "name": "get_weather"}
    req = parse_responses(body(instructions="sys", tools=[TOOL], tool_choice=named,
                               parallel_tool_calls=False, max_output_tokens=7, temperature=0.5, top_p=0.9,
                               reasoning={"effort": "low"}, metadata={"k": "v"}, user="u", store=False))
    prep = chat_to_preprocess(to_chat(req, req.items), "rid")
    assert orjson.loads(prep.messages_json) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert orjson.loads(prep.tools_json) == [{"type": "function", "function": {
        "name": "get_weather", "description": "weather", "parameters": TOOL["parameters"]}}]
    assert (prep.tool_choice.mode, prep.tool_choice.function_name) == \
        (common_pb2.TOOL_CHOICE_MODE_NAMED, "get_weather")
    # parallel_tool_calls false: the gateway's own postprocess option, beside the tools and the tool choice.
    options = postprocess_options(to_chat(req, req.items), prep)
    assert options.single_tool_call
    assert options.tools_json == prep.tools_json and options.tool_choice == prep.tool_choice
    assert orjson.loads(prep.chat_template_kwargs_json) == {"reasoning_effort": "low"}
    r = prep.request
    assert r.stop.max_tokens == 7 and r.sampling.temperature == 0.5 and r.sampling.top_p == pytest.approx(0.9)
    # A named tool_choice is forced through guided decoding, as on the chat path.
    assert orjson.loads(r.sampling.guided_decoding.json_schema) == TOOL["parameters"]


@pytest.mark.parametrize("fmt,expect", [
    ({"type": "json_schema", "name": "r", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
     common_pb2.GuidedDecoding(json_schema='{"type":"object","properties":{"a":{"type":"integer"}}}')),
    ({"type": "json_object"}, common_pb2.GuidedDecoding(json_object=True)),
])
def test_text_format_is_guided_decoding(fmt, expect):
    req = parse_responses(body(text={"format": fmt}))
    prep = chat_to_preprocess(to_chat(req, req.items), "rid")
    assert prep.request.sampling.guided_decoding == expect


def test_text_format_text_is_unconstrained():
    req = parse_responses(body(text={"format": {"type": "text"}}))
    assert not chat_to_preprocess(to_chat(req, req.items), "rid").request.sampling.HasField("guided_decoding")


def test_worker_pin_header_is_carried():
    assert parse_responses(body(), {"x-worker-instance-id": "w1"}).pins.worker_id == "w1"
