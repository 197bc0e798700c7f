"""Request bodies the gateway must refuse with a 400 naming the field (issue 23's bad inputs)."""

from __future__ import annotations

import struct

import orjson
import pytest

from services.common.errors import InvalidRequest
from services.gateway.anthropic.request import parse_messages
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.kserve import protocol
from services.gateway.kserve.request import parse_request

pytestmark = pytest.mark.unit


def chat(messages=None, **fields) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages or [{"role": "user", "content": "hi"}], **fields})


def rejects(raw: bytes, param: str, parse=parse_chat) -> str:
    with pytest.raises(InvalidRequest) as e:
        parse(raw)
    assert e.value.param == param, e.value.message
    return e.value.message


def call(**fields) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}, **fields}


@pytest.mark.parametrize("tool_calls,param", [
    ([{"id": 5, "function": "f"}], "messages[1].tool_calls[0].id"),
    ([call(function="f")], "messages[1].tool_calls[0].function"),
    ([call(id=5)], "messages[1].tool_calls[0].id"),
    ([call(type="retrieval")], "messages[1].tool_calls[0].type"),
    ([call(function={"arguments": "{}"})], "messages[1].tool_calls[0].function.name"),
    ([call(function={"name": 3, "arguments": "{}"})], "messages[1].tool_calls[0].function.name"),
    ([call(function={"name": "f", "arguments": {"x": 1}})], "messages[1].tool_calls[0].function.arguments"),
    ([call(function={"name": "f"})], "messages[1].tool_calls[0].function.arguments"),
    ([call(), "f"], "messages[1].tool_calls[1]"),
    ({"id": "c1"}, "messages[1].tool_calls"),
])
def test_malformed_tool_calls_are_refused_by_path_before_any_template(tool_calls, param):
    message = rejects(chat([{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": None, "tool_calls": tool_calls}]), param)
    assert "template" not in message and "str object" not in message


def test_tool_calls_belong_to_assistant_messages():
    rejects(chat([{"role": "user", "content": "hi", "tool_calls": [call()]}]), "messages[0].tool_calls")


def test_well_formed_tool_calls_pass():
    req = parse_chat(chat([{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": None, "tool_calls": [call(), call(id="c2")]},
                           {"role": "tool", "tool_call_id": "c1", "content": "ok"}]))
    assert len(req.messages[1]["tool_calls"]) == 2


@pytest.mark.parametrize("name", [7, 1.5, True, ["a"], {"n": 1}])
def test_a_message_name_must_be_a_string(name):
    rejects(chat([{"role": "user", "content": "hi", "name": name}]), "messages[0].name")
    assert parse_chat(chat([{"role": "user", "content": "hi", "name": "ann"}])).messages[0]["name"] == "ann"


@pytest.mark.parametrize("pin", ["w\n1", "w\x00", "\x1b[31m", "w" * 129])
def test_a_pin_that_cannot_be_a_worker_id_is_refused_without_echoing_it(pin):
    for parse in (parse_chat, parse_completion):
        body = orjson.loads(chat()) if parse is parse_chat else {"model": "m", "prompt": "hi"}
        message = rejects(orjson.dumps({**body, "nvext": {"backend_instance_id": pin}}),
                          "nvext.backend_instance_id", parse)
        assert pin not in message


def anthropic(messages: list) -> bytes:
    return orjson.dumps({"model": "m", "max_tokens": 8, "messages": messages})


def _use(call_id: str) -> dict:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "f", "input": {}}]}


def _result(call_id: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "ok"}]}


@pytest.mark.parametrize("messages,param", [
    ([_result("toolu_1")], "messages[0].content[0].tool_use_id"),
    ([{"role": "user", "content": "hi"}, _use("toolu_1"), _result("toolu_2")], "messages[2].content[0].tool_use_id"),
    # A result answers the assistant message right before it, not one further back.
    ([{"role": "user", "content": "hi"}, _use("toolu_1"), _result("toolu_1"), {"role": "assistant", "content": "k"},
      _result("toolu_1")], "messages[4].content[0].tool_use_id"),
])
def test_an_anthropic_tool_result_must_answer_a_tool_use_of_the_previous_message(messages, param):
    rejects(anthropic(messages), param, parse_messages)


def test_an_anthropic_tool_result_answering_its_call_passes():
    req = parse_messages(anthropic([{"role": "user", "content": "hi"}, _use("toolu_1"), _result("toolu_1")]))
    assert req.messages[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"}


def test_a_kserve_input_with_typed_contents_beside_raw_input_contents_is_refused_naming_it():
    req = protocol.ModelInferRequest(model_name="m")
    req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"typed")
    req.raw_input_contents.append(struct.pack("<I", 3) + b"raw")
    with pytest.raises(InvalidRequest) as e:
        parse_request(req)
    assert e.value.param == "text_input" and "raw_input_contents" in e.value.message
    req.inputs[0].ClearField("contents")
    assert parse_request(req).parsed.prompts == ["raw"]
