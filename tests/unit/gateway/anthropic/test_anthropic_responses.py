"""The Anthropic renderer: exact SSE grammar, the folded message, and both read back by the official SDK."""

import dataclasses

import orjson
import pytest
from anthropic._models import construct_type
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent

from services.common.errors import InvalidRequest, NotFound, NoWorkers, Overloaded, WorkerFailed
from services.gateway.anthropic import errors
from services.gateway.anthropic.render import MessageRenderer
from services.gateway.core.delta import Delta

pytestmark = pytest.mark.unit


@dataclasses.dataclass
class Call:
    """The postprocessor's ToolCallDelta fields."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


def first(**kw) -> Delta:
    return Delta(0, prompt_tokens=20, cached_tokens=16, counts_prompt=True, **kw)


THINK_TEXT_TOOL = [
    first(reasoning="Let me ", completion_tokens=2),
    Delta(0, reasoning="think.", text="Checking", completion_tokens=3),
    Delta(0, text=" now.", tool_calls=[Call(0, "call_a", "get_weather", '{"city": ')], completion_tokens=4),
    Delta(0, tool_calls=[Call(0, arguments='"Paris"}'), Call(1, "call_b", "get_time", "")], completion_tokens=2),
    Delta(0, tool_calls=[Call(1, arguments="{}")], finish_reason="tool_calls", completion_tokens=1),
]


def events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for frame in raw.split(b"\n\n"):
        if not frame:
            continue
        lines = frame.split(b"\n")
        assert len(lines) == 2 and lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), frame
        name, data = lines[0][7:].decode(), orjson.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def stream(deltas, batches=1) -> bytes:
    r = MessageRenderer(message_id="msg_1", model="m")
    size = max(1, len(deltas) // batches)
    raw = b"".join(r.sse(deltas[i:i + size]) for i in range(0, len(deltas), size))
    return raw + r.sse_end()


def folded(deltas) -> dict:
    r = MessageRenderer(message_id="msg_1", model="m")
    r.fold(deltas)
    return orjson.loads(r.body())


def test_stream_event_sequence_is_anthropics_grammar():
    evs = events(stream(THINK_TEXT_TOOL, batches=5))
    assert [name for name, _ in evs] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    starts = [e["content_block"] for n, e in evs if n == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""},
                      {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}},
                      {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}}]
    indexes = [e["index"] for n, e in evs if n.startswith("content_block")]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2, 3}
    kinds = [e["delta"]["type"] for n, e in evs if n == "content_block_delta"]
    assert kinds == ["thinking_delta"] * 2 + ["text_delta"] * 2 + ["input_json_delta"] * 3
    start = evs[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["usage"]["input_tokens"] == 4 and start["usage"]["cache_read_input_tokens"] == 16
    delta = evs[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12
    assert b"[DONE]" not in stream(THINK_TEXT_TOOL)


@pytest.mark.parametrize("batches", [1, 2, 5])
def test_sdk_accumulates_the_stream_into_the_folded_message(batches):
    snapshot = None
    bufs: dict = {}
    for _, data in events(stream(THINK_TEXT_TOOL, batches)):
        event = construct_type(type_=RawMessageStreamEvent, value=data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    body = folded(THINK_TEXT_TOOL)
    message = Message.model_validate(body)  # the non-stream body is a valid SDK Message
    assert snapshot.to_dict(exclude_none=True) == message.to_dict(exclude_none=True)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert body["content"][0]["thinking"] == "Let me think." and body["content"][1]["text"] == "Checking now."
    assert body["content"][2]["input"] == {"city": "Paris"} and body["content"][3]["input"] == {}
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 4, "output_tokens": 12, "cache_read_input_tokens": 16,
                             "cache_creation_input_tokens": 0}


@pytest.mark.parametrize("finish, stop_string, reason, sequence", [
    ("stop", "", "end_turn", None),
    ("stop", "END", "stop_sequence", "END"),
    ("length", "", "max_tokens", None),
])
def test_stop_reasons(finish, stop_string, reason, sequence):
    deltas = [first(text="hello", completion_tokens=1), Delta(0, finish_reason=finish, stop_reason=stop_string)]
    body = folded(deltas)
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)
    assert body["content"] == [{"type": "text", "text": "hello"}]
    message_delta = [e for n, e in events(stream(deltas)) if n == "message_delta"]
    assert message_delta[0]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}


def test_length_wins_over_a_cut_tool_call_and_keeps_its_partial_input():
    deltas = [first(tool_calls=[Call(0, "call_x", "get_weather", '{"city": "Par')], finish_reason="length")]
    body = folded(deltas)
    assert body["stop_reason"] == "max_tokens"
    assert body["content"] == [{"type": "tool_use", "id": "call_x", "name": "get_weather",
                                "input": {"city": "Par"}}]


def test_empty_output_still_has_the_whole_grammar():
    r = MessageRenderer(message_id="msg_1", model="m")
    assert [n for n, _ in events(r.sse_end())] == ["message_start", "message_delta", "message_stop"]
    assert folded([])["content"] == []


@pytest.mark.parametrize("err, status, kind", [
    (InvalidRequest("'max_tokens' is required", param="max_tokens"), 400, "invalid_request_error"),
    (NotFound("model: nope"), 404, "not_found_error"),
    (Overloaded("busy"), 529, "overloaded_error"),
    (NoWorkers("no worker"), 529, "overloaded_error"),
    (WorkerFailed("worker died"), 500, "api_error"),
])
def test_error_shapes_and_statuses(err, status, kind):
    assert errors.http_status(err) == status
    assert orjson.loads(errors.error_body(err)) == {"type": "error", "error": {"type": kind, "message": err.message}}
    [(name, data)] = events(errors.sse_error_event(err))
    assert name == "error" and data["error"]["type"] == kind
