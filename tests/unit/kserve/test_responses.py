"""Deltas -> ModelInferResponse: outputs, usage and Triton's final-response marker."""

from __future__ import annotations

import orjson
import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.gateway.core.delta import Delta
from services.gateway.kserve.render import CHAT_OUTPUTS, FINAL, TEXT_OUTPUTS, InferResponseBuilder

pytestmark = pytest.mark.unit


def decode(resp, name: str) -> bytes:
    i = [o.name for o in resp.outputs].index(name)
    raw = resp.raw_output_contents[i]
    size = int.from_bytes(raw[:4], "little")
    assert len(raw) == 4 + size and list(resp.outputs[i].shape) == [1] and resp.outputs[i].datatype == "BYTES"
    return raw[4:]


def first(text: str) -> Delta:
    return Delta(index=0, text=text, completion_tokens=1, prompt_tokens=4, counts_prompt=True)


def last(text: str, reason: str = "stop") -> Delta:
    return Delta(index=0, text=text, completion_tokens=1, finish_reason=reason)


def test_unary_response_folds_text_and_reports_usage_without_a_final_marker():
    b = InferResponseBuilder("m", "id-1", ("text_output", "finish_reason"), decoupled=False)
    resp = b.data([first("Hel"), Delta(index=0, text="lo", completion_tokens=1), last("!", "length")])
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "1", "id-1")
    assert decode(resp, "text_output") == b"Hello!" and decode(resp, "finish_reason") == b"length"
    assert FINAL not in resp.parameters
    assert resp.parameters["prompt_tokens"].int64_param == 4 and resp.parameters["completion_tokens"].int64_param == 3
    assert b.closing() is None


def test_streamed_responses_mark_only_the_last_as_final():
    b = InferResponseBuilder("m", "", ("text_output", "finish_reason"), decoupled=True)
    a = b.data([first("é")])
    z = b.data([last(" ok")])
    assert a.parameters[FINAL].bool_param is False and decode(a, "finish_reason") == b""
    assert "completion_tokens" not in a.parameters
    assert z.parameters[FINAL].bool_param is True and z.parameters["completion_tokens"].int64_param == 2
    assert decode(a, "text_output").decode() == "é"
    assert b.closing() is None


def test_empty_final_response_closes_when_asked_or_when_no_finish_reason_came():
    b = InferResponseBuilder("m", "", ("text_output",), decoupled=True, empty_final=True)
    z = b.data([first("a"), last("b")])
    assert z.parameters[FINAL].bool_param is False and [o.name for o in z.outputs] == ["text_output"]
    closing = b.closing()
    assert closing is not None and closing.parameters[FINAL].bool_param and not closing.outputs
    assert closing.parameters["completion_tokens"].int64_param == 2
    cut = InferResponseBuilder("m", "", ("text_output",), decoupled=True)
    cut.data([first("a")])
    assert cut.closing().parameters[FINAL].bool_param


def call(index: int, arguments: str, name: str = "", call_id: str = ""):
    return postprocessor_pb2.ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)


def test_a_streamed_chat_response_carries_reasoning_and_tool_call_chunks():
    """What the OpenAI chunks carry, as output tensors: the reasoning and the tool-call deltas."""
    b = InferResponseBuilder("m", "", CHAT_OUTPUTS, decoupled=True)
    a = b.data([Delta(0, reasoning="think", completion_tokens=1, prompt_tokens=4, counts_prompt=True)])
    z = b.data([Delta(0, tool_calls=[call(0, '{"city":', "get_weather", "call_1")], completion_tokens=1),
                Delta(0, tool_calls=[call(0, '"Paris"}')], completion_tokens=1, finish_reason="tool_calls")])
    assert decode(a, "reasoning_content") == b"think" and orjson.loads(decode(a, "tool_calls")) == []
    assert decode(z, "text_output") == b"" and decode(z, "finish_reason") == b"tool_calls"
    assert orjson.loads(decode(z, "tool_calls")) == [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":'}},
        {"index": 0, "function": {"arguments": '"Paris"}'}}]


def test_a_folded_chat_response_carries_whole_tool_calls():
    b = InferResponseBuilder("m", "id", CHAT_OUTPUTS, decoupled=False)
    b.fold([Delta(0, reasoning="hm", completion_tokens=1, prompt_tokens=4, counts_prompt=True)])
    b.fold([Delta(0, tool_calls=[call(0, '{"a":', "f", "c1")], completion_tokens=1)])
    b.fold([Delta(0, tool_calls=[call(0, "1}")]), Delta(0, tool_calls=[call(1, "{}", "g", "c2")],
                                                      finish_reason="tool_calls")])
    [resp] = b.body()
    assert decode(resp, "reasoning_content") == b"hm" and decode(resp, "finish_reason") == b"tool_calls"
    assert orjson.loads(decode(resp, "tool_calls")) == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    assert resp.parameters["prompt_tokens"].int64_param == 4 and FINAL not in resp.parameters


def test_only_the_requested_outputs_are_built():
    b = InferResponseBuilder("m", "", TEXT_OUTPUTS, decoupled=True)
    r = b.data([Delta(0, text="x", reasoning="r", tool_calls=[call(0, "{}", "f", "c")])])
    assert [o.name for o in r.outputs] == list(TEXT_OUTPUTS)
