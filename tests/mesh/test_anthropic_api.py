"""The Anthropic Messages API through Envoy and the split mesh, driven by the official SDK and raw HTTP.

The demo model's workers register the hermes tool-call and qwen3 reasoning parsers; the mocker's
script (tests/golden/mocker_script.json) answers a greeting, counts to ten, reasons about 2+2, and
calls get_weather for the weather in Paris, answering once the tool's result is in the prompt.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import orjson
import pytest

from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

HELLO = "Hello! 👋 How can I help you today? 你好，世界。"
COUNT = "one two three four five six seven eight nine ten"
TOOLS = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                           "required": ["city"]}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGS = {"city": "Paris", "unit": "°C"}
REASONING = "The user wants the weather; I should call get_weather."
HEADERS = {"content-type": "application/json", "x-api-key": "unused", "anthropic-version": "2023-06-01"}


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.fixture
def claude(mesh):
    """The official anthropic client against the mesh's Envoy, without retries (a failure must show)."""
    c = anthropic.Anthropic(base_url=mesh.url, api_key="unused", max_retries=0, timeout=30)
    yield c
    c.close()


def count(claude, messages, **kw) -> int:
    return claude.messages.count_tokens(model=DEMO, messages=messages, **kw).input_tokens


def test_non_stream_message_text_stop_reason_and_usage(claude):
    m = claude.messages.create(model=DEMO, max_tokens=64, messages=ask("Say hello"))
    assert m.type == "message" and m.role == "assistant" and m.model == DEMO and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == HELLO
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens > 5
    # Anthropic's split: total input = input_tokens + cache reads, and it is the prompt count_tokens reports.
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == count(claude, ask("Say hello"))
    assert m.usage.cache_creation_input_tokens == 0


def test_models_route_answers_the_anthropic_sdk_in_its_shape(claude):
    ids = [m.id for m in claude.models.list()]
    assert DEMO in ids and ids == sorted(ids)
    model = claude.models.retrieve(DEMO)  # an id with a slash
    assert model.id == DEMO and model.type == "model" and model.display_name == DEMO
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.models.retrieve("no-such-model")
    assert e.value.body["error"]["type"] == "not_found_error"


def test_count_tokens_is_the_rendered_prompt(claude):
    plain = count(claude, ask("Say hello"))
    assert plain > 5
    assert count(claude, ask("Say hello"), system="You are a terse assistant.") > plain
    assert count(claude, ask("Say hello"), tools=TOOLS) > plain
    # thinking reaches the chat template: Qwen3's template closes an empty think block when it is off.
    off = count(claude, ask("Say hello"), thinking={"type": "disabled"})
    on = count(claude, ask("Say hello"), thinking={"type": "enabled", "budget_tokens": 1024})
    assert on == plain and off > on


def test_stream_with_the_sdk_helpers(claude):
    with claude.messages.stream(model=DEMO, max_tokens=64, messages=ask("Say hello")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == HELLO
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == HELLO
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 5
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == count(claude, ask("Say hello"))


def sse_events(raw: bytes) -> list[tuple[str, dict]]:
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"", "the stream ends with a complete event"
    out = []
    for frame in frames[:-1]:
        event, data = frame.split(b"\n")
        assert event.startswith(b"event: ") and data.startswith(b"data: "), frame
        out.append((event[7:].decode(), orjson.loads(data[6:])))
    return out


def raw_stream(mesh, body) -> bytes:
    with httpx.stream("POST", f"{mesh.url}/v1/messages", headers=HEADERS, timeout=30,
                      content=orjson.dumps({**body, "stream": True})) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return b"".join(r.iter_raw())


def test_raw_sse_is_exactly_anthropics_event_sequence(mesh):
    raw = raw_stream(mesh, {"model": DEMO, "max_tokens": 64, "messages": ask("Say hello")})
    assert b"[DONE]" not in raw
    evs = sse_events(raw)
    names = [n for n, _ in evs]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in evs)
    assert evs[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta") == HELLO
    assert evs[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert evs[-2][1]["usage"]["output_tokens"] > 5
    assert evs[0][1]["message"]["usage"]["input_tokens"] > 5


def test_stop_sequences_and_max_tokens(claude):
    m = claude.messages.create(model=DEMO, max_tokens=64, messages=ask("Count to ten"), stop_sequences=["five"])
    assert m.content[0].text == "one two three four " and m.stop_reason == "stop_sequence"
    assert m.stop_sequence == "five"
    with claude.messages.stream(model=DEMO, max_tokens=64, messages=ask("Count to ten"),
                                stop_sequences=["zzz", " fi"]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "one two three four" and final.stop_sequence == " fi"
    m = claude.messages.create(model=DEMO, max_tokens=3, messages=ask("Count to ten"))
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3 and COUNT.startswith(m.content[0].text)


def test_tool_use_round_trip_non_stream(claude):
    m = claude.messages.create(model=DEMO, max_tokens=256, messages=QUESTION, tools=TOOLS)
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == REASONING
    call = m.content[1]
    assert call.name == "get_weather" and call.input == ARGS and call.id
    assert m.stop_reason == "tool_use"
    history = [*QUESTION, {"role": "assistant", "content": m.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": json.dumps({"sky": "sunny", "temp_c": 21})}]}]
    answer = claude.messages.create(model=DEMO, max_tokens=256, messages=history, tools=TOOLS)
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text == "It is sunny and 21 °C in Paris." and answer.stop_reason == "end_turn"


def test_tool_use_round_trip_stream(claude, mesh):
    with claude.messages.stream(model=DEMO, max_tokens=256, messages=QUESTION, tools=TOOLS) as s:
        partial = [e.partial_json for e in s if e.type == "input_json"]
        final = s.get_final_message()
    [call] = [b for b in final.content if b.type == "tool_use"]
    assert call.input == ARGS and json.loads("".join(partial)) == ARGS and final.stop_reason == "tool_use"
    evs = sse_events(raw_stream(mesh, {"model": DEMO, "max_tokens": 256, "messages": QUESTION, "tools": TOOLS}))
    starts = [d["content_block"] for n, d in evs if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "tool_use"]
    assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    deltas = [d["delta"]["type"] for n, d in evs if n == "content_block_delta"]
    assert set(deltas) == {"thinking_delta", "input_json_delta"}
    history = [*QUESTION, {"role": "assistant", "content": final.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
    with claude.messages.stream(model=DEMO, max_tokens=256, messages=history, tools=TOOLS) as s:
        assert "".join(s.text_stream) == "It is sunny and 21 °C in Paris."


def test_forced_tool_choice_gives_a_tool_use_block(claude):
    m = claude.messages.create(model=DEMO, max_tokens=256, messages=ask("Count to ten"), tools=TOOLS,
                               tool_choice={"type": "tool", "name": "get_weather"})
    [call] = [b for b in m.content if b.type == "tool_use"]
    assert call.name == "get_weather" and m.stop_reason == "tool_use"
    jsonschema.validate(call.input, TOOLS[0]["input_schema"])


def test_output_config_format_is_structured_output(claude):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 4},
                                               "why": {"type": "string", "minLength": 3}},
              "required": ["answer", "why"], "additionalProperties": False}
    m = claude.messages.create(model=DEMO, max_tokens=256, messages=ask("Say hello"),
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert [b.type for b in m.content] == ["text"]
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_thinking_blocks_streaming_and_not(claude):
    kw = {"model": DEMO, "max_tokens": 2048, "messages": ask("What is 2+2?"),
          "thinking": {"type": "enabled", "budget_tokens": 1024}}
    m = claude.messages.create(**kw)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == [
        ("thinking", "Two plus two is four."), ("text", "2 + 2 = 4.")]
    with claude.messages.stream(**kw) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
        final = s.get_final_message()
    assert thinking == "Two plus two is four."
    assert final.to_dict(exclude_none=True)["content"] == m.to_dict(exclude_none=True)["content"]


def test_repeated_prompt_reports_cache_reads(claude):
    prompt = ask("Tell me a story about " + "the mesh and its many services " * 20)
    total = count(claude, prompt)
    usages = [claude.messages.create(model=DEMO, max_tokens=2, messages=prompt).usage for _ in range(4)]
    assert max(u.cache_read_input_tokens for u in usages) > 0
    assert all(u.input_tokens + u.cache_read_input_tokens == total for u in usages)


# ---- errors: Anthropic's status and shape, before any byte of a stream ------------------------------------------

def post(mesh, path, body):
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(f"{mesh.url}{path}", content=data, headers=HEADERS, timeout=60)


BAD = [
    ("invalid json", b"{not json", 400, "invalid_request_error", "JSON"),
    ("missing max_tokens", {"model": DEMO, "messages": ask("x")}, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens wrong type", {"model": DEMO, "max_tokens": "ten", "messages": ask("x")}, 400,
     "invalid_request_error", "max_tokens"),
    ("messages wrong type", {"model": DEMO, "max_tokens": 5, "messages": "hi"}, 400, "invalid_request_error",
     "messages"),
    ("temperature out of range", {"model": DEMO, "max_tokens": 5, "messages": ask("x"), "temperature": 2}, 400,
     "invalid_request_error", "temperature"),
    ("unknown field", {"model": DEMO, "max_tokens": 5, "messages": ask("x"), "bogus": 1}, 400,
     "invalid_request_error", "bogus"),
    ("unknown model", {"model": "nope", "max_tokens": 5, "messages": ask("x")}, 404, "not_found_error", "nope"),
    ("context window", {"model": DEMO, "max_tokens": 4_000_000, "messages": ask("x")}, 400,
     "invalid_request_error", "context length"),
]


@pytest.mark.parametrize("name,body,status,kind,needle", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_anthropics_error_shape_and_status(mesh, name, body, status, kind, needle, stream):
    if stream and isinstance(body, dict):
        body = {**body, "stream": True}
    r = post(mesh, "/v1/messages", body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind
    assert needle in r.json()["error"]["message"]
    assert "grpc-status" not in r.headers


def test_sdk_raises_typed_errors(claude):
    with pytest.raises(anthropic.NotFoundError) as nf:
        claude.messages.create(model="nope", max_tokens=5, messages=ask("x"))
    assert nf.value.status_code == 404 and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=DEMO, max_tokens=5, messages=ask("x"), extra_body={"frequency_penalty": 1})
    assert "frequency_penalty" in bad.value.message
    with pytest.raises(anthropic.BadRequestError), claude.messages.stream(
            model=DEMO, max_tokens=5, messages=ask("x"), extra_body={"temperature": 3}) as s:
        s.get_final_message()
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="nope", messages=ask("x"))
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.count_tokens(model=DEMO, messages=[])
    assert "messages" in bad.value.message


def test_too_large_body_is_413_in_anthropics_shape(mesh):
    r = post(mesh, "/v1/messages", {"model": DEMO, "max_tokens": 5, "messages": ask("a" * (33 << 20))})
    assert r.status_code == 413
    assert r.json() == {"type": "error", "error": {"type": "request_too_large",
                                                  "message": "The request body is too large (limit 32 MiB)"}}
