"""Message and tool normalisation before rendering (dynamo-frontend.md §3.2)."""

from __future__ import annotations

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.openai_request import parse_chat
from services.preprocessor.core.messages import normalise_messages, normalise_tools

pytestmark = pytest.mark.unit


def test_null_keys_are_dropped():
    [m] = normalise_messages([{"role": "assistant", "content": None, "tool_calls": None, "name": None}], True)
    assert m == {"role": "assistant"}


def test_text_parts_are_flattened_with_newlines():
    [m] = normalise_messages([{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], True)
    assert m["content"] == "a\nb"


def test_media_parts_become_placeholders():
    [m] = normalise_messages([{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:..."}}]}], True)
    assert m["content"] == [{"type": "text", "text": "look"}, {"type": "image"}]


def test_a_refusal_part_the_gateway_accepts_is_text_to_the_template():
    [m] = normalise_messages([{"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}], True)
    assert m["content"] == "I can't."


def test_tool_call_arguments_are_parsed():
    [m] = normalise_messages([{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"id": "c3", "type": "function", "function": {"name": "h", "arguments": ""}},
    ]}], True)
    args = [c["function"]["arguments"] for c in m["tool_calls"]]
    assert args == [{"x": 1}, "not json", {}]


def test_reasoning_is_kept_when_the_template_reads_it():
    msg = {"role": "assistant", "content": "answer", "reasoning_content": "hmm"}
    assert normalise_messages([msg], True) == [msg]


def test_reasoning_is_injected_when_the_template_ignores_it():
    [m] = normalise_messages([{"role": "assistant", "content": "answer", "reasoning_content": "hmm"}], False)
    assert m == {"role": "assistant", "content": "<think>hmm</think>answer"}


def test_reasoning_sent_back_under_the_reasoning_field_name_counts_as_reasoning_content():
    # What a client of --reasoning-field-name reasoning receives, and sends back in the history.
    [m] = normalise_messages([{"role": "assistant", "content": "answer", "reasoning": "hmm"}], False)
    assert m == {"role": "assistant", "content": "<think>hmm</think>answer"}
    [m] = normalise_messages([{"role": "assistant", "content": "answer", "reasoning": "hmm"}], True)
    assert m == {"role": "assistant", "content": "answer", "reasoning_content": "hmm"}


def test_input_is_not_mutated():
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    normalise_messages([msg], True)
    assert msg["content"] is None and msg["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("bad", [[], {}, "hi", [{"content": "no role"}], ["text"],
                                 [{"role": "user", "content": [{"type": "hologram"}]}],
                                 [{"role": "user", "content": ["bare string part"]}]])
def test_bad_messages_are_refused_by_their_one_owner_the_gateway(bad):
    with pytest.raises(InvalidRequest) as e:
        parse_chat(orjson.dumps({"model": "m", "messages": bad}))
    assert e.value.param.startswith("messages")


def test_tool_parameters_are_completed():
    tools = normalise_tools([
        {"type": "function", "function": {"name": "a"}},
        {"type": "function", "function": {"name": "b", "parameters": {"properties": {"x": {"type": "int"}}}}},
        {"type": "function", "function": {"name": "c", "parameters": {"type": "object"}}},
    ])
    assert [t["function"]["parameters"] for t in tools] == [
        {"type": "object", "properties": {}},
        {"type": "object", "properties": {"x": {"type": "int"}}},
        {"type": "object", "properties": {}},
    ]


@pytest.mark.parametrize("bad", [{"type": "function"}, ["f"]])
def test_bad_tools_are_refused_by_the_gateway(bad):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": bad}
    with pytest.raises(InvalidRequest) as e:
        parse_chat(orjson.dumps(body))
    assert e.value.param.startswith("tools")


def test_developer_role_becomes_system():
    out = normalise_messages([{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}], False)
    assert [m["role"] for m in out] == ["system", "user"]
