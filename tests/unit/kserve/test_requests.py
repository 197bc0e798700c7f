"""KServe requests -> the gateway's parsed OpenAI requests, through the HTTP API's own parsers."""

from __future__ import annotations

import json
import struct

import pytest

from services.common.errors import InvalidRequest
from services.gateway.core.request import ChatRequest, CompletionRequest
from services.gateway.kserve import protocol
from services.gateway.kserve.request import parse_request

pytestmark = pytest.mark.unit


def request(inputs: dict, params: dict | None = None, *, raw: bool = False, outputs=()):
    """Builds a ModelInferRequest the way tritonclient does (raw) or with typed contents."""
    req = protocol.ModelInferRequest(model_name="m", id="client-id")
    for name, value in inputs.items():
        if isinstance(value, bool):
            t = req.inputs.add(name=name, datatype="BOOL", shape=[1])
            req.raw_input_contents.append(struct.pack("<?", value)) if raw else t.contents.bool_contents.append(value)
        elif isinstance(value, list):
            t = req.inputs.add(name=name, datatype="INT32", shape=[len(value)])
            if raw:
                req.raw_input_contents.append(struct.pack(f"<{len(value)}i", *value))
            else:
                t.contents.int_contents.extend(value)
        else:
            data = value.encode()
            t = req.inputs.add(name=name, datatype="BYTES", shape=[1])
            if raw:
                req.raw_input_contents.append(struct.pack("<I", len(data)) + data)
            else:
                t.contents.bytes_contents.append(data)
    for key, value in (params or {}).items():
        p = req.parameters[key]
        kind = {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
        setattr(p, kind, value)
    for name in outputs:
        req.outputs.add(name=name)
    return req


@pytest.mark.parametrize("raw", [False, True])
def test_text_input_is_a_completion_with_sampling_parameters(raw):
    k = parse_request(request({"text_input": "héllo"}, {"max_tokens": 7, "temperature": 0.5, "top_k": 3, "seed": 9,
                                                         "ignore_eos": True, "min_tokens": 2, "stop": "x"}, raw=raw))
    assert isinstance(k.parsed, CompletionRequest) and not k.chat
    assert k.parsed.prompts == ["héllo"] and k.parsed.model == "m"
    s = k.parsed.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed, s.ignore_eos, s.min_tokens, s.stop) == (
        7, 0.5, 3, 9, True, 2, ["x"])
    assert k.stream is None and not k.empty_final and k.outputs == ("text_output", "finish_reason")


def test_completion_defaults_follow_the_http_api():
    assert parse_request(request({"text_input": "hi"})).parsed.sampling.max_tokens == 16


def test_stop_as_json_list_and_integer_temperature():
    k = parse_request(request({"text_input": "hi"}, {"stop": json.dumps(["a", "b"]), "temperature": 1}))
    assert k.parsed.sampling.stop == ["a", "b"] and k.parsed.sampling.temperature == 1.0


@pytest.mark.parametrize("raw", [False, True])
def test_input_ids_are_a_pre_tokenized_prompt(raw):
    k = parse_request(request({"input_ids": [5, 6, 7]}, raw=raw))
    assert k.parsed.prompts == [[5, 6, 7]]


def test_messages_and_tools_make_a_chat_request():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    k = parse_request(request({"messages": json.dumps(msgs), "tools": json.dumps(tools)},
                              {"tool_choice": "auto", "chat_template_kwargs": '{"enable_thinking": false}'}))
    assert isinstance(k.parsed, ChatRequest) and k.chat
    assert k.parsed.messages == msgs and k.parsed.tools == tools and k.parsed.tool_choice == "auto"
    assert k.parsed.chat_template_kwargs == {"enable_thinking": False}


def test_chat_parameter_turns_text_input_into_one_user_message():
    k = parse_request(request({"text_input": "hi"}, {"chat": True}))
    assert k.parsed.messages == [{"role": "user", "content": "hi"}]


def test_stream_flags_and_empty_final():
    assert parse_request(request({"text_input": "hi", "stream": False}, raw=True)).stream is False
    assert parse_request(request({"text_input": "hi", "streaming": True})).stream is True
    k = parse_request(request({"text_input": "hi"}, {"stream": True, "triton_enable_empty_final_response": True}))
    assert k.stream is True and k.empty_final


@pytest.mark.parametrize(("inputs", "params", "needle"), [
    ({"text_input": "hi"}, {"bogus": 1, "alpha": True}, "Unsupported parameter(s): 'alpha', 'bogus'"),
    ({"text_input": "hi"}, {"tool_choice": "auto"}, "chat-only"),
    ({"text_input": "hi"}, {"top_p": 3.0}, "'top_p' must be between"),
    ({"text_input": "hi"}, {"max_tokens": 0}, "'max_tokens' must be between 1 and 4294967295"),
    ({"text_input": "hi"}, {"ignore_eos": 1}, "'ignore_eos' must be a boolean"),
    ({"text_input": "hi"}, {"stop": "[1, 2]"}, "'stop' must be a string or an array of strings"),
    ({"text_input": "hi"}, {"chat": True, "chat_template_kwargs": "{nope"}, "must be a JSON string"),
    ({"prompt": "hi"}, {}, "unknown input(s) 'prompt'"),
    ({}, {}, "needs a 'text_input'"),
    ({"text_input": "a", "input_ids": [1]}, {}, "either 'text_input' or 'input_ids'"),
    ({"input_ids": [1]}, {"chat": True}, "cannot be combined with chat"),
    ({"messages": "not json"}, {}, "input 'messages' must hold JSON"),
    ({"messages": json.dumps([{"role": "wizard", "content": "x"}])}, {}, "'messages[0].role' must be one of"),
    ({"text_input": "hi", "tools": "[]"}, {}, "input 'tools' needs a chat request"),
    ({"text_input": "hi", "stream": True}, {"stream": False}, "'stream' is given more than once"),
])
def test_invalid_requests_name_the_problem(inputs, params, needle):
    with pytest.raises(InvalidRequest) as e:
        parse_request(request(inputs, params))
    assert needle in e.value.message


def test_tensor_checks():
    bad_shape = request({"text_input": "hi"})
    bad_shape.inputs[0].shape[:] = [2]
    with pytest.raises(InvalidRequest, match="shape \\[2\\] needs 2 elements"):
        parse_request(bad_shape)
    truncated = request({"text_input": "hi"}, raw=True)
    truncated.raw_input_contents[0] = truncated.raw_input_contents[0][:-1]
    with pytest.raises(InvalidRequest, match="runs past the end"):
        parse_request(truncated)
    missing = request({"text_input": "hi", "stream": True}, raw=True)
    del missing.raw_input_contents[1]
    with pytest.raises(InvalidRequest, match="one per input"):
        parse_request(missing)
    with pytest.raises(InvalidRequest, match="unknown output"):
        parse_request(request({"text_input": "hi"}, outputs=["logits"]))
    assert parse_request(request({"text_input": "hi"}, outputs=["text_output"])).outputs == ("text_output",)
