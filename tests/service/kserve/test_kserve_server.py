"""tritonclient (sync and aio, unmodified) against the gateway's KServe v2 service."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue

import numpy as np
import pytest

from tests.conftest import require_module
from tests.service.kserve.conftest import MODEL

require_module("tritonclient")
import tritonclient.grpc as triton  # noqa: E402
import tritonclient.grpc.aio as triton_aio  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.service

STORY = ("Once upon a time, a small gRPC message crossed the mesh. It met Envoy at the edge, and they streamed "
         "happily ever after. THE END. Then nothing more happened.")


def text_input(text: str, name: str = "text_input") -> triton.InferInput:
    t = triton.InferInput(name, [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return t


def ids_input(ids: list[int], dtype: str = "INT64") -> triton.InferInput:
    t = triton.InferInput("input_ids", [len(ids)], dtype)
    t.set_data_from_numpy(np.array(ids, dtype=np.int64 if dtype == "INT64" else np.int32))
    return t


def text_of(result) -> str:
    return b"".join(result.as_numpy("text_output")).decode()


def output(resp, name: str) -> bytes:
    """The single element of a BYTES output in a raw ModelInferResponse."""
    return triton.InferResult(resp).as_numpy(name)[0]


@pytest.fixture
async def aio_client(kserve_gateway):
    client = triton_aio.InferenceServerClient(kserve_gateway.target)
    yield client
    await client.close()


async def test_health_and_metadata(kserve_gateway, aio_client):
    assert await aio_client.is_server_live()
    assert await aio_client.is_server_ready()
    assert await aio_client.is_model_ready(MODEL)
    assert not await aio_client.is_model_ready("no-such-model")
    assert (await aio_client.get_server_metadata()).name == "meshfront"
    meta = await aio_client.get_model_metadata(MODEL, as_json=True)
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "messages", "input_ids"}
    assert [o["name"] for o in meta["outputs"]] == ["text_output", "finish_reason", "reasoning_content", "tool_calls"]
    config = (await aio_client.get_model_config(MODEL, as_json=True))["config"]
    assert config["model_transaction_policy"]["decoupled"] is True
    assert config["input"][0]["data_type"] == "TYPE_STRING"


async def test_infer_honours_max_tokens_and_reports_usage(aio_client):
    full = await aio_client.infer(MODEL, [text_input("Tell me a story")], parameters={"max_tokens": 200})
    assert text_of(full) == STORY
    assert full.as_numpy("finish_reason")[0] == b"stop"
    short = await aio_client.infer(MODEL, [text_input("Tell me a story")], parameters={"max_tokens": 3},
                                   request_id="r-1")
    assert STORY.startswith(text_of(short)) and 0 < len(text_of(short)) < 20
    assert short.as_numpy("finish_reason")[0] == b"length"
    params = short.get_response().parameters
    assert params["completion_tokens"].int64_param == 3 and params["prompt_tokens"].int64_param > 0
    assert short.get_response().id == "r-1"


async def test_stop_parameter_as_string_and_json_list(aio_client):
    one = await aio_client.infer(MODEL, [text_input("Count to ten")], parameters={"stop": " four"})
    assert text_of(one) == "one two three"
    many = await aio_client.infer(MODEL, [text_input("Count to ten")], parameters={"stop": json.dumps(["six", "two"])})
    assert text_of(many) == "one "


async def test_chat_messages_and_pre_tokenized_prompt(aio_client):
    messages = text_input(json.dumps([{"role": "user", "content": "Count to ten"}]), "messages")
    chat = await aio_client.infer(MODEL, [messages])
    assert text_of(chat) == "one two three four five six seven eight nine ten"
    as_param = await aio_client.infer(MODEL, [text_input("Count to ten")], parameters={"chat": True})
    assert text_of(as_param) == text_of(chat)
    ids = await aio_client.infer(MODEL, [ids_input([1, 2, 3, 4])], parameters={"max_tokens": 5, "seed": 7})
    again = await aio_client.infer(MODEL, [ids_input([1, 2, 3, 4], "INT32")], parameters={"max_tokens": 5, "seed": 7})
    assert text_of(ids) and text_of(ids) == text_of(again)


@pytest.mark.parametrize(("inputs", "params", "needle"), [
    ([("text_input", "hi")], {"bogus": 1, "other": "x"}, "'bogus', 'other'"),
    ([("text_input", "hi")], {"temperature": 9.0}, "'temperature' must be between"),
    ([("text_input", "hi")], {"tool_choice": "auto"}, "chat-only"),
    ([("prompt", "hi")], {}, "unknown input(s) 'prompt'"),
    ([("text_input", "hi")], {"stream": True}, "use ModelStreamInfer"),
])
async def test_invalid_requests_are_invalid_argument(aio_client, inputs, params, needle):
    with pytest.raises(InferenceServerException) as e:
        await aio_client.infer(MODEL, [text_input(v, n) for n, v in inputs], parameters=params)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert needle in e.value.message()


async def test_unknown_model_is_not_found(kserve_gateway, aio_client):
    with pytest.raises(InferenceServerException) as e:
        await aio_client.infer("no-such-model", [text_input("hi")])
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        await aio_client.get_model_metadata("no-such-model")
    assert e.value.status() == "StatusCode.NOT_FOUND"


async def test_aio_stream_infer_several_responses_with_final_marker(aio_client):
    async def requests():
        yield {"model_name": MODEL, "inputs": [text_input("Tell me a story")], "request_id": "a",
               "parameters": {"max_tokens": 20}}
        yield {"model_name": MODEL, "inputs": [text_input("hi")], "request_id": "bad", "parameters": {"nope": 1}}

    by_id: dict[str, list] = {"a": []}
    errors = []
    async for result, error in aio_client.stream_infer(requests()):
        if error is not None:
            errors.append(str(error))
            continue
        resp = result.get_response()
        by_id[resp.id].append(resp)
        if errors and resp.parameters["triton_final_response"].bool_param:
            break
    assert len(errors) == 1 and "INVALID_ARGUMENT" in errors[0] and "'nope'" in errors[0]
    chunks = by_id["a"]
    assert len(chunks) >= 2, "the mocker paces tokens: a streamed story comes in several responses"
    assert [c.parameters["triton_final_response"].bool_param for c in chunks] == [False] * (len(chunks) - 1) + [True]
    text = b"".join(output(c, "text_output") for c in chunks).decode()
    assert STORY.startswith(text) and len(text) > 20
    assert output(chunks[-1], "finish_reason") == b"length"


async def test_aio_stream_empty_final_response_and_folded_stream(aio_client):
    async def requests():
        yield {"model_name": MODEL, "inputs": [text_input("Count to ten")], "request_id": "folded",
               "parameters": {"stream": False}}

    results = []
    async for result, error in aio_client.stream_infer(requests()):
        assert error is None
        results.append(result.get_response())
        break
    assert len(results) == 1 and results[0].parameters["triton_final_response"].bool_param
    assert output(results[0], "text_output") == b"one two three four five six seven eight nine ten"


async def test_sync_client_infer_and_stream_with_empty_final(kserve_gateway):
    # The server runs on this test's event loop, so the blocking client runs in a thread.
    await asyncio.wait_for(asyncio.to_thread(sync_client_session, kserve_gateway.target), 30)


def sync_client_session(target: str) -> None:
    client = triton.InferenceServerClient(target)
    try:
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        result = client.infer(MODEL, [text_input("Count to ten")], parameters={"max_tokens": 2})
        assert text_of(result) == "one two"
        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(MODEL, [text_input("Count to ten")], request_id="s",
                                  enable_empty_final_response=True)
        responses = []
        while True:
            result, error = got.get(timeout=10)
            assert error is None, error
            resp = result.get_response()
            responses.append(resp)
            if resp.parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
        assert not responses[-1].outputs, "the empty final response has no outputs"
        assert all(not r.parameters["triton_final_response"].bool_param for r in responses[:-1])
        text = b"".join(output(r, "text_output") for r in responses[:-1]).decode()
        assert text == "one two three four five six seven eight nine ten"
    finally:
        client.close()


async def test_no_live_worker_means_not_ready(kserve_gateway, aio_client):
    saved = dict(kserve_gateway.workers)
    kserve_gateway.workers.clear()
    try:
        assert not await aio_client.is_server_ready()
        assert not await aio_client.is_model_ready(MODEL)
        with pytest.raises(InferenceServerException) as e:
            await aio_client.infer(MODEL, [text_input("hi")])
        assert e.value.status() == "StatusCode.NOT_FOUND"
    finally:
        kserve_gateway.workers.update(saved)
    await asyncio.sleep(0)


async def test_unreachable_worker_is_unavailable(kserve_gateway, aio_client):
    """The model is listed but its only worker does not answer: UNAVAILABLE, as a retryable status."""
    card = next(iter(kserve_gateway.workers.values()))
    ghost = dataclasses.replace(card, worker_id="ghost", address="127.0.0.1:1",
                                model=dataclasses.replace(card.model, name="ghost-model"))
    kserve_gateway.workers["ghost"] = ghost
    try:
        assert await aio_client.is_model_ready("ghost-model")
        with pytest.raises(InferenceServerException) as e:
            await aio_client.infer("ghost-model", [text_input("hi")])
        assert e.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        del kserve_gateway.workers["ghost"]
