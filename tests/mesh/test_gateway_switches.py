"""Dynamo's gateway switches through Envoy, each set away from Meshfront's default on one all-in-one mesh:
``--reasoning-field-name reasoning``, both streaming dispatch events on, the Anthropic API and KServe off.

The defaults (reasoning_content, no events, both APIs served) are what the rest of the mesh tier runs
(tests/mesh/test_tools.py, test_anthropic_api.py, test_kserve.py). The mocker's script
(tests/golden/mocker_script.json) reasons and then calls get_weather for the weather question.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import require_module, sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker, start_mesh

pytestmark = pytest.mark.mesh

SWITCHES = ("--reasoning-field-name", "reasoning", "--enable-streaming-tool-dispatch",
            "--enable-streaming-reasoning-dispatch", "--no-enable-anthropic-api", "--no-kserve-grpc-server")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
REASONING = "The user wants the weather; I should call get_weather."
ARGS = {"city": "Paris", "unit": "°C"}


@pytest.fixture(scope="module")
def switched_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS)], inproc=True,
                   service_args={"gateway": SWITCHES})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(switched_mesh):
    c = sdk_client(switched_mesh, timeout=30)
    yield c
    c.close()


def sse_frames(mesh, **body) -> list[tuple[str | None, dict]]:
    """A streamed chat answer as a raw SSE client reads it: (event name or None, JSON data), [DONE] left out."""
    frames = []
    with httpx.stream("POST", f"{mesh.url}/v1/chat/completions", timeout=30,
                      json={"model": DEMO, "stream": True, **body}) as r:
        assert r.status_code == 200
        text = r.read().decode()
    for frame in text.split("\n\n"):
        if not frame or frame == "data: [DONE]":
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        frames.append((lines.get("event"), json.loads(lines["data"])))
    return frames


def test_reasoning_travels_in_the_named_field_whole_and_streamed(client, switched_mesh):
    ask = [{"role": "user", "content": "What is 2+2?"}]
    message = client.chat.completions.create(model=DEMO, messages=ask).choices[0].message
    assert message.model_extra == {"reasoning": "Two plus two is four."} and message.content == "2 + 2 = 4."
    chunks = [data for name, data in sse_frames(switched_mesh, messages=ask) if name is None]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Two plus two is four."
    assert not any("reasoning_content" in d for d in deltas)


def test_dispatch_events_come_before_the_chunks_they_belong_to(switched_mesh):
    frames = sse_frames(switched_mesh, messages=WEATHER, tools=TOOLS)
    names = [name for name, _ in frames]
    assert names.count("reasoning_dispatch") == 1 and names.count("tool_call_dispatch") == 1
    assert {name for name in names} == {None, "reasoning_dispatch", "tool_call_dispatch"}
    first_call = next(i for i, (name, data) in enumerate(frames)
                      if name is None and data["choices"] and data["choices"][0]["delta"].get("tool_calls"))
    finish = next(i for i, (name, data) in enumerate(frames)
                  if name is None and data["choices"] and data["choices"][0]["finish_reason"])
    last_reasoning = max(i for i, (name, data) in enumerate(frames)
                         if name is None and data["choices"] and data["choices"][0]["delta"].get("reasoning"))
    thinking_ended = next(i for i, (name, data) in enumerate(frames) if name is None and data["choices"]
                          and {"content", "tool_calls"} & {k for k, v in data["choices"][0]["delta"].items() if v})
    reasoning_at, call_at = names.index("reasoning_dispatch"), names.index("tool_call_dispatch")

    def just_before(event_at: int, chunk_at: int) -> bool:
        """The event comes before the chunk, with only other events between them."""
        return event_at < chunk_at and all(names[i] is not None for i in range(event_at, chunk_at))

    # The reasoning is dispatched just before the chunk where thinking ended (its first content or call). When
    # tokens arrive together, as on a loaded machine, that chunk also carries the reasoning's last words, and
    # it can be the finishing one too: both events then precede it, the reasoning's first.
    # The call is whole once the choice finishes: dispatched just before that chunk.
    assert just_before(reasoning_at, thinking_ended) and last_reasoning <= thinking_ended <= first_call, (
        last_reasoning, reasoning_at, thinking_ended, first_call, names)
    assert just_before(call_at, finish) and reasoning_at < call_at, names
    assert frames[reasoning_at][1] == {"index": 0, "reasoning_content": REASONING}
    dispatched = frames[call_at][1]
    call = dispatched["tool_call"]
    assert dispatched["choice_index"] == 0 and call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == ARGS
    # The chunks are unchanged: the same call and reasoning, in the renamed field.
    streamed = [tc for name, data in frames if name is None and data["choices"]
                for tc in data["choices"][0]["delta"].get("tool_calls", ())]
    assert streamed[0]["id"] == call["id"]
    assert "".join(tc["function"]["arguments"] for tc in streamed) == call["function"]["arguments"]
    assert "".join(data["choices"][0]["delta"].get("reasoning", "") for name, data in frames
                   if name is None and data["choices"]) == REASONING


def test_the_openai_sdk_reads_the_stream_and_hands_each_event_over_as_an_item(client):
    items = list(client.chat.completions.create(model=DEMO, messages=WEATHER, tools=TOOLS, stream=True))
    # The SDK keeps no event names: an event is an item built from its data, without a chunk's fields.
    chunks = [c for c in items if c.model_extra == {}]
    extras = [c.model_extra for c in items if c.model_extra]
    assert [sorted(e) for e in extras] == [["index", "reasoning_content"], ["choice_index", "tool_call"]]
    assert all(c.object is None and c.choices is None for c in items if c.model_extra)  # what a client skips
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == ARGS
    assert extras[1]["tool_call"]["id"] == calls[0].id
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_anthropic_api_off_is_a_404_in_anthropics_shape(switched_mesh):
    for path, body in (("/v1/messages", {"max_tokens": 8}), ("/v1/messages/count_tokens", {})):
        r = httpx.post(f"{switched_mesh.url}{path}", timeout=30, headers={"anthropic-version": "2023-06-01"},
                       json={"model": DEMO, "messages": [{"role": "user", "content": "Hi"}], **body})
        assert r.status_code == 404
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
        assert "--enable-anthropic-api" in error["error"]["message"]


def test_kserve_off_answers_unimplemented_on_envoys_port(switched_mesh):
    require_module("tritonclient")
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(switched_mesh.grpc_target)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.is_server_live()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED" and "--kserve-grpc-server" in e.value.message()
    finally:
        client.close()
