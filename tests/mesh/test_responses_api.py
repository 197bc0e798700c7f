"""The Responses API end to end: the official openai SDK (and raw HTTP) → Envoy → gateway(s) → mesh → mocker.

Most tests run on the session's split mesh. A second mesh in the all-in-one shape with two gateway
replicas and a short ``--responses-ttl-s`` checks that a stored response is continued, read and deleted
on another replica than the one that wrote it, and that it expires.
"""

from __future__ import annotations

import json
import signal
import time

import grpc
import httpx
import jsonschema
import openai
import orjson
import pytest
from google.api import httpbody_pb2
from meshfront.gateway.v1 import responses_pb2, responses_pb2_grpc

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker, start_mesh

pytestmark = pytest.mark.mesh

HELLO = "Hello! 👋 How can I help you today? 你好，世界。"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                         "required": ["city"]}}]
WEATHER = "What is the weather in Paris?"
ARGS = {"city": "Paris", "unit": "°C"}
SUNNY = "It is sunny and 21 °C in Paris."
SHORT_TTL_S = 6
# Served by the replicas' mesh only, by one slow worker (about 0.1 s a token): a stream to freeze.
SLOW = "demo-slow"


def test_non_stream_text_and_usage(client):
    r = client.responses.create(model=DEMO, input="Say hello", metadata={"case": "plain"}, temperature=0.5)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == HELLO
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert r.usage.input_tokens > 5 and r.usage.output_tokens > 5
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.metadata == {"case": "plain"} and r.temperature == 0.5 and r.model == DEMO
    assert r.incomplete_details is None and r.error is None


def test_messages_and_instructions(client):
    r = client.responses.create(model=DEMO, instructions="You are terse.", input=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count to ten"}]}])
    assert r.output_text == "one two three four five six seven eight nine ten"
    assert r.instructions == "You are terse."


def test_reasoning_is_its_own_output_item(client):
    r = client.responses.create(model=DEMO, input="What is 2+2?", reasoning={"effort": "low"})
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "Two plus two is four."
    assert r.output_text == "2 + 2 = 4."
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    assert r.reasoning.effort == "low"


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(model=DEMO, input="Count to ten", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_sdk_stream(client):
    events = list(client.responses.create(model=DEMO, input="Say hello", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == HELLO
    assert events[-1].response.output_text == HELLO and events[-1].response.usage.output_tokens > 5
    # The SDK's own accumulator checks the grammar (item identities, indexes) as it goes.
    with client.responses.stream(model=DEMO, input="What is 2+2?") as stream:
        final = stream.get_final_response()
    assert final.output_text == "2 + 2 = 4." and [i.type for i in final.output] == ["reasoning", "message"]


def _sse(mesh, body: dict) -> tuple[httpx.Response, list[tuple[str, dict]]]:
    with httpx.stream("POST", f"{mesh.url}/v1/responses", json=body, timeout=30) as r:
        raw = b"".join(r.iter_raw())
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"", raw[-200:]
    events = []
    for frame in frames[:-1]:
        name, data = frame.split(b"\n")
        assert name.startswith(b"event: ") and data.startswith(b"data: "), frame  # no [DONE], no comments
        event = orjson.loads(data[6:])
        assert event["type"] == name[7:].decode()
        events.append((event["type"], event))
    return r, events


def _collapse(types: list[str]) -> list[str]:
    """Consecutive deltas of one kind as one entry: how many a reply takes depends on batching."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


def test_raw_event_order_and_sequence_numbers(mesh):
    r, events = _sse(mesh, {"model": DEMO, "input": "What is 2+2?", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    assert _collapse([t for t, _ in events]) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    by_type = {t: e for t, e in events}
    assert by_type["response.reasoning_text.done"]["text"] == "Two plus two is four."
    assert by_type["response.output_text.done"]["text"] == "2 + 2 = 4."
    done = [e for t, e in events if t == "response.output_item.done"]
    assert [d["output_index"] for d in done] == [0, 1]
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and [i["id"] for i in final["output"]] == [d["item"]["id"] for d in done]


def test_raw_tool_call_events(mesh):
    _, events = _sse(mesh, {"model": DEMO, "input": WEATHER, "tools": TOOLS, "stream": True})
    types = _collapse([t for t, _ in events])
    assert types[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    args = "".join(e["delta"] for t, e in events if t == "response.function_call_arguments.delta")
    assert json.loads(args) == ARGS
    added = [e for t, e in events if t == "response.output_item.added"][-1]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["call_id"].startswith("call_")


def _tool_round_trip(client, stream: bool):
    if stream:
        with client.responses.stream(model=DEMO, input=WEATHER, tools=TOOLS) as s:
            first = s.get_final_response()
    else:
        first = client.responses.create(model=DEMO, input=WEATHER, tools=TOOLS)
    calls = [i for i in first.output if i.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and json.loads(calls[0].arguments) == ARGS
    assert first.output[0].type == "reasoning"
    # Only the tool's output goes up: the question and the call come from the stored response.
    answer = client.responses.create(model=DEMO, previous_response_id=first.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"sky": "sunny"})}])
    assert answer.output_text == SUNNY and answer.previous_response_id == first.id
    assert not [i for i in answer.output if i.type == "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_round_trip_with_previous_response_id(client, stream):
    _tool_round_trip(client, stream)


def test_tool_round_trip_by_hand(client):
    """Without storage: the client sends the whole conversation, the earlier output items included."""
    first = client.responses.create(model=DEMO, input=WEATHER, tools=TOOLS, store=False)
    call = next(i for i in first.output if i.type == "function_call")
    history = [{"role": "user", "content": WEATHER}, *[i.model_dump(exclude_none=True) for i in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    assert client.responses.create(model=DEMO, input=history, tools=TOOLS, store=False).output_text == SUNNY


def test_forced_tool_choice(client):
    r = client.responses.create(model=DEMO, input="Count to ten", tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"})
    [call] = [i for i in r.output if i.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), TOOLS[0]["parameters"])


def test_text_format_json_schema_and_object(client):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 4},
                                               "why": {"type": "string", "minLength": 3}},
              "required": ["answer", "why"], "additionalProperties": False}
    r = client.responses.create(model=DEMO, input="Say hello",
                                text={"format": {"type": "json_schema", "name": "result", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    r = client.responses.create(model=DEMO, input="Say hello", text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


def test_get_and_delete(client):
    r = client.responses.create(model=DEMO, input="Say hello")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == HELLO and got.status == "completed"
    assert got.usage.output_tokens == r.usage.output_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(r.id)
    assert r.id in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=DEMO, input="Hi", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id" and e.value.body["code"] == "previous_response_not_found"


def test_store_false_stores_nothing(client):
    r = client.responses.create(model=DEMO, input="Say hello", store=False)
    assert r.output_text == HELLO and r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_previous_response_id(client, stream):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=DEMO, input="Hi", previous_response_id="resp_doesnotexist", stream=stream)
    assert e.value.body["param"] == "previous_response_id" and "resp_doesnotexist" in e.value.body["message"]


BAD = [
    ("built-in tool", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("background", {"background": True}, "background"),
    ("image input", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, "input[0].content[0].type"),
    ("file input", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
     "input[0].content[0].type"),
    ("unknown field", {"frobnicate": 1}, "frobnicate"),
    ("bad schema", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text.format.schema"),
    ("temperature", {"temperature": 7}, "temperature"),
]


@pytest.mark.parametrize("name,extra,param", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_400_naming_the_field(mesh, name, extra, param, stream):
    r = httpx.post(f"{mesh.url}/v1/responses", json={"model": DEMO, "input": "hi", "stream": stream, **extra},
                   timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_unknown_model_and_unknown_id_are_404(mesh):
    r = httpx.post(f"{mesh.url}/v1/responses", json={"model": "nope", "input": "hi"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{mesh.url}/v1/responses/resp_nope", timeout=30)
        assert r.status_code == 404 and "resp_nope" in r.json()["error"]["message"], r.text


# ---- two gateway replicas (all-in-one shape), short TTL ------------------------------------------------------------

@pytest.fixture(scope="module")
def replicas(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS),
                                      mocker(demo_model_dir, SLOW, "0.05")], gateways=2, inproc=True,
                   service_args={"gateway": ("--responses-ttl-s", str(SHORT_TTL_S)),
                                 "postprocessor": ("--stream-idle-timeout-s", "1")})
    yield m
    stop_cleanly(m)


class Replica:
    """One gateway's ResponsesService over its own gRPC port (Envoy would pick the replica itself)."""

    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = responses_pb2_grpc.ResponsesServiceStub(self.channel)

    def create(self, **body) -> dict:
        [out] = list(self.stub.CreateResponse(httpbody_pb2.HttpBody(content_type="application/json",
                                                                    data=orjson.dumps(body)), timeout=30))
        return orjson.loads(out.data)

    def get(self, response_id: str) -> dict:
        return orjson.loads(self.stub.GetResponse(responses_pb2.GetResponseRequest(response_id=response_id),
                                                  timeout=10).data)

    def delete(self, response_id: str) -> None:
        self.stub.DeleteResponse(responses_pb2.DeleteResponseRequest(response_id=response_id), timeout=10)


def test_previous_response_id_across_replicas(replicas):
    a, b = (Replica(p) for p in replicas.plan.gateway_ports)
    try:
        first = a.create(model=DEMO, input=WEATHER, tools=TOOLS)
        call = next(i for i in first["output"] if i["type"] == "function_call")
        answer = b.create(model=DEMO, input=[{"type": "function_call_output", "call_id": call["call_id"],
                                              "output": "sunny"}], tools=TOOLS, previous_response_id=first["id"])
        assert answer["output"][0]["content"][0]["text"] == SUNNY
        assert a.get(answer["id"])["output"] == answer["output"]
        assert b.get(first["id"])["id"] == first["id"]
        b.delete(first["id"])
        with pytest.raises(grpc.RpcError) as e:
            a.get(first["id"])
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        a.channel.close()
        b.channel.close()


def test_stored_responses_expire(replicas):
    client = sdk_client(replicas, timeout=30)
    try:
        r = client.responses.create(model=DEMO, input="Say hello")
        assert client.responses.retrieve(r.id).output_text == HELLO
        time.sleep(SHORT_TTL_S + 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.responses.retrieve(r.id)
            except openai.NotFoundError:
                break
            assert time.monotonic() < deadline, "the stored response outlived --responses-ttl-s"
            time.sleep(0.5)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=DEMO, input="Hi", previous_response_id=r.id)
    finally:
        client.close()


def test_backend_failure_mid_stream_is_response_failed(replicas):
    """The only worker of the model freezes after the first tokens: no worker to migrate to, so the
    stream (already 200) ends with response.failed, and nothing is stored."""
    events = []
    try:
        with httpx.stream("POST", f"{replicas.url}/v1/responses", timeout=60,
                          json={"model": SLOW, "input": "Tell me a story", "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(orjson.loads(line[6:]))
                    if events[-1]["type"] == "response.output_text.delta" and len(events) == 5:
                        replicas.kill("mocker-1", signal.SIGSTOP)
    finally:
        replicas.kill("mocker-1", signal.SIGCONT)
    types = [e["type"] for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-1] == "response.failed" and "response.completed" not in types, types
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error" and failed["error"]["message"]
    assert failed["output"][0]["status"] == "incomplete"
    r = httpx.get(f"{replicas.url}/v1/responses/{failed['id']}", timeout=10)
    assert r.status_code == 404
