"""KServe v2 over the real mesh: tritonclient directly against the gateway and through Envoy.

Uses the session ``mesh`` (two mocker workers for the demo model, scripted
answers from tests/golden/mocker_script.json).
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from tests.conftest import require_module
from tests.mesh.conftest import DEMO

require_module("tritonclient")
import tritonclient.grpc as triton  # noqa: E402
import tritonclient.grpc.aio as triton_aio  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.mesh

COUNT = "one two three four five six seven eight nine ten"


def bytes_input(name: str, text: str) -> triton.InferInput:
    t = triton.InferInput(name, [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return t


def text_of(result) -> str:
    return b"".join(result.as_numpy("text_output")).decode()


@pytest.fixture(params=["gateway", "envoy"])
def target(request, mesh) -> str:
    return f"127.0.0.1:{mesh.plan.gateway_ports[0]}" if request.param == "gateway" else mesh.grpc_target


async def test_health_metadata_infer_and_errors(target):
    client = triton_aio.InferenceServerClient(target)
    try:
        assert await client.is_server_live() and await client.is_server_ready()
        assert await client.is_model_ready(DEMO) and not await client.is_model_ready("nope")
        assert (await client.get_model_metadata(DEMO)).platform == "meshfront"
        result = await client.infer(DEMO, [bytes_input("text_input", "Count to ten")], parameters={"max_tokens": 3})
        assert text_of(result) == "one two three"
        assert result.as_numpy("finish_reason")[0] == b"length"
        with pytest.raises(InferenceServerException) as e:
            await client.infer("nope", [bytes_input("text_input", "hi")])
        assert e.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as e:
            await client.infer(DEMO, [bytes_input("text_input", "hi")], parameters={"top_k": 0, "colour": "red"})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "'colour'" in e.value.message()
    finally:
        await client.close()


async def test_stream_infer_several_responses(target):
    client = triton_aio.InferenceServerClient(target)

    async def one_request():
        yield {"model_name": DEMO, "inputs": [bytes_input("text_input", "Tell me a story")],
               "parameters": {"max_tokens": 30}, "request_id": "story"}

    try:
        responses = []
        async for result, error in client.stream_infer(one_request()):
            assert error is None, error
            responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert len(responses) >= 2
        assert "".join(text_of(r) for r in responses).startswith("Once upon a time")
        assert responses[-1].as_numpy("finish_reason")[0] == b"length"
        assert responses[-1].get_response().parameters["completion_tokens"].int64_param == 30
    finally:
        await client.close()


def test_sync_client_through_envoy(mesh):
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        assert client.is_model_ready(DEMO)
        assert text_of(client.infer(DEMO, [bytes_input("text_input", "Count to ten")])) == COUNT
    finally:
        client.close()


STORY_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story"}]
DIFFERENTIAL = [
    # (HTTP path, HTTP body, KServe inputs, KServe parameters)
    ("chat/completions", {"messages": [{"role": "user", "content": "Say hello"}]},
     {"messages": json.dumps([{"role": "user", "content": "Say hello"}])}, {}),
    ("chat/completions", {"messages": STORY_CHAT, "max_tokens": 12, "stop": ["gRPC"]},
     {"messages": json.dumps(STORY_CHAT)}, {"max_tokens": 12, "stop": "gRPC"}),
    ("completions", {"prompt": "Tell me a story", "max_tokens": 25}, {"text_input": "Tell me a story"},
     {"max_tokens": 25}),
    ("completions", {"prompt": "Write forever", "max_tokens": 20, "seed": 42, "ignore_eos": True},
     {"text_input": "Write forever"}, {"max_tokens": 20, "seed": 42, "ignore_eos": True}),
]


@pytest.mark.parametrize(("path", "body", "inputs", "params"), DIFFERENTIAL)
def test_http_and_kserve_give_identical_text(mesh, path, body, inputs, params):
    r = httpx.post(f"{mesh.url}/v1/{path}", json={"model": DEMO, **body}, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    http_text = choice["message"]["content"] if path.startswith("chat") else choice["text"]
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        result = client.infer(DEMO, [bytes_input(k, v) for k, v in inputs.items()], parameters=params)
    finally:
        client.close()
    assert http_text and text_of(result) == http_text
    assert result.as_numpy("finish_reason")[0].decode() == choice["finish_reason"]


# The demo model's scripted tool call and reasoning (as tests/mesh/test_tools.py asks for them over OpenAI).
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _chat_inputs(messages: list[dict], tools: list[dict] | None = None) -> list[triton.InferInput]:
    inputs = [bytes_input("messages", json.dumps(messages))]
    if tools is not None:
        inputs.append(bytes_input("tools", json.dumps(tools)))
    return inputs


def _one(result, name: str) -> str:
    [value] = result.as_numpy(name)
    return value.decode()


def _without_ids(calls: list[dict]) -> list[dict]:
    """Tool calls with their ids checked for shape and dropped (each response mints its own)."""
    assert all(c["id"].startswith("call_") for c in calls)
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def test_kserve_chat_gets_the_openai_tool_calls_and_reasoning(mesh):
    """A KServe chat with tools gets what an OpenAI client gets: the tool calls (JSON, OpenAI's shape) and the
    reasoning, not an empty ``text_output`` beside ``finish_reason: tool_calls``."""
    r = httpx.post(f"{mesh.url}/v1/chat/completions", json={"model": DEMO, "messages": WEATHER, "tools": TOOLS},
                   timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        result = client.infer(DEMO, _chat_inputs(WEATHER, TOOLS))
    finally:
        client.close()
    assert _one(result, "finish_reason") == "tool_calls"
    assert _one(result, "text_output") == ""
    assert _one(result, "reasoning_content") == choice["message"]["reasoning_content"]
    calls = json.loads(_one(result, "tool_calls"))
    assert _without_ids(calls) == _without_ids(choice["message"]["tool_calls"])
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "°C"}


async def test_kserve_stream_carries_tool_call_chunks_and_reasoning(target):
    client = triton_aio.InferenceServerClient(target)

    async def one_request():
        yield {"model_name": DEMO, "inputs": _chat_inputs(WEATHER, TOOLS), "request_id": "weather"}

    try:
        responses = []
        async for result, error in client.stream_infer(one_request()):
            assert error is None, error
            responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        await client.close()
    chunks = [c for r in responses for c in json.loads(_one(r, "tool_calls"))]
    heads = [c for c in chunks if "id" in c]
    assert len(heads) == 1 and heads[0]["function"]["name"] == "get_weather" and heads[0]["type"] == "function"
    assert all(c["index"] == 0 for c in chunks)
    arguments = "".join(c["function"]["arguments"] for c in chunks)
    assert json.loads(arguments) == {"city": "Paris", "unit": "°C"}
    assert "".join(_one(r, "reasoning_content") for r in responses) == (
        "The user wants the weather; I should call get_weather.")
    assert "".join(_one(r, "text_output") for r in responses) == ""
    assert _one(responses[-1], "finish_reason") == "tool_calls"


def test_kserve_outputs_are_announced_and_chat_only_outputs_refused_for_completions(mesh):
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        meta = client.get_model_metadata(DEMO, as_json=True)
        assert [o["name"] for o in meta["outputs"]] == ["text_output", "finish_reason", "reasoning_content",
                                                        "tool_calls"]
        completion = client.infer(DEMO, [bytes_input("text_input", "Count to ten")], parameters={"max_tokens": 2})
        assert {o["name"] for o in completion.get_response(as_json=True)["outputs"]} == {"text_output",
                                                                                         "finish_reason"}
        with pytest.raises(InferenceServerException) as e:
            client.infer(DEMO, [bytes_input("text_input", "hi")], outputs=[triton.InferRequestedOutput("tool_calls")])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "chat only" in e.value.message()
    finally:
        client.close()


def test_kserve_requests_are_counted_in_metrics(mesh):
    """KServe requests appear in the gateway's request families, under endpoint ``kserve``."""
    from tests.mesh.test_metrics import processes_of, scrape, value

    def kserve_requests(scraped, **labels) -> float:
        return sum(value(scraped[p], "meshfront_gateway_requests", "_total", model=DEMO, endpoint="kserve", **labels)
                   for p in processes_of(scraped, "meshfront_gateway_"))

    before = scrape(mesh)
    client = triton.InferenceServerClient(mesh.grpc_target)
    try:
        client.infer(DEMO, [bytes_input("text_input", "Count to ten")], parameters={"max_tokens": 3})
        with pytest.raises(InferenceServerException):
            client.infer(DEMO, [bytes_input("text_input", "hi")], parameters={"colour": "red"})
    finally:
        client.close()
    deadline = time.monotonic() + 3  # the books close just after the last byte
    while True:
        after = scrape(mesh)
        done = kserve_requests(after, stream="false", status="200") - kserve_requests(before, stream="false",
                                                                                      status="200")
        if done >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert done >= 1
    tokens = sum(value(after[p], "meshfront_gateway_output_tokens", "_total", model=DEMO)
                 - value(before[p], "meshfront_gateway_output_tokens", "_total", model=DEMO)
                 for p in processes_of(after, "meshfront_gateway_"))
    assert tokens >= 3
    refused = sum(value(after[p], "meshfront_gateway_requests", "_total", endpoint="kserve", status="400")
                  - value(before[p], "meshfront_gateway_requests", "_total", endpoint="kserve", status="400")
                  for p in processes_of(after, "meshfront_gateway_"))
    assert refused >= 1
