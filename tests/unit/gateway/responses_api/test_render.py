"""The response object and the event grammar, from deltas as the pipeline yields them."""

import orjson
import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.common.errors import WorkerFailed
from services.common.nats_store import StoreUnavailable
from services.gateway.core.delta import Delta
from services.gateway.responses_api.render import ResponseObjectBuilder, ResponsesRenderer, echo_fields, sse
from services.gateway.responses_api.request import parse_responses

pytestmark = pytest.mark.unit


def builder(**kw) -> ResponseObjectBuilder:
    req = parse_responses(orjson.dumps({"model": "m", "input": "hi", **kw}))
    return ResponseObjectBuilder("resp_1", echo_fields(req), created_at=100)


def call(name="", arguments="", id_="", index=0):
    return postprocessor_pb2.ToolCallDelta(index=index, id=id_, name=name, arguments=arguments)


def run(b: ResponseObjectBuilder, batches: list[list[Delta]]) -> list[dict]:
    events = b.start()
    for batch in batches:
        events += b.feed(batch)
    events += b.finish()
    return [*events, b.final_event()]


def test_text_reply_event_grammar_and_response():
    b = builder(metadata={"k": "v"}, temperature=0.3)
    events = run(b, [[Delta(0, text="Hel", prompt_tokens=9, cached_tokens=4, counts_prompt=True, completion_tokens=1)],
                     [Delta(0, text="lo", completion_tokens=1)], [Delta(0, finish_reason="stop")]])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    created = events[0]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    added = events[2]
    assert added["output_index"] == 0 and added["item"]["status"] == "in_progress" and added["item"]["content"] == []
    item_id = added["item"]["id"]
    assert item_id.startswith("msg_")
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    assert all(e["item_id"] == item_id for e in events[3:8]) and events[8]["item"]["id"] == item_id
    assert events[6]["text"] == "Hello"
    final = events[-1]["response"]
    assert final == b.response()
    assert final["status"] == "completed" and final["incomplete_details"] is None and final["error"] is None
    assert final["output"] == [{"id": item_id, "type": "message", "status": "completed", "role": "assistant",
                                "content": [{"type": "output_text", "text": "Hello", "annotations": [],
                                             "logprobs": []}]}]
    assert final["usage"] == {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2,
                              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 11}
    assert final["metadata"] == {"k": "v"} and final["temperature"] == 0.3 and final["model"] == "m"
    assert final["object"] == "response" and final["id"] == "resp_1" and final["created_at"] == 100


def test_reasoning_then_tool_calls():
    b = builder()
    events = run(b, [
        [Delta(0, reasoning="think ", completion_tokens=2, prompt_tokens=5, counts_prompt=True)],
        [Delta(0, reasoning="hard", completion_tokens=1)],
        [Delta(0, tool_calls=[call("get_weather", '{"city"', "call_a")], completion_tokens=3)],
        [Delta(0, tool_calls=[call(arguments=': "Paris"}')], completion_tokens=2)],
        [Delta(0, tool_calls=[call("get_weather", '{"city": "Rome"}', "call_b", 1)], completion_tokens=4)],
        [Delta(0, finish_reason="tool_calls")]])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6]["text"] == "think hard"
    assert events[12]["arguments"] == '{"city": "Paris"}'
    out = b.response()["output"]
    assert [i["type"] for i in out] == ["reasoning", "function_call", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": "think hard"}] and out[0]["summary"] == []
    assert {k: out[1][k] for k in ("call_id", "name", "arguments", "status")} == {
        "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}', "status": "completed"}
    assert out[1]["id"].startswith("fc_") and out[2]["call_id"] == "call_b"
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
    assert b.response()["usage"]["output_tokens_details"]["reasoning_tokens"] == 3


def test_mixed_delta_splits_reasoning_tokens_by_share():
    b = builder()
    b.feed([Delta(0, reasoning="abc", text="d", completion_tokens=4)])
    b.finish()
    assert b.response()["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    assert [i["type"] for i in b.response()["output"]] == ["reasoning", "message"]


def test_max_output_tokens_makes_it_incomplete():
    b = builder(max_output_tokens=2)
    events = run(b, [[Delta(0, text="one two", completion_tokens=2, finish_reason="length")]])
    assert events[-1]["type"] == "response.incomplete"
    r = events[-1]["response"]
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["status"] == "incomplete" and r["max_output_tokens"] == 2


def test_failure_mid_stream():
    b = builder()
    events = b.start() + b.feed([Delta(0, text="par", completion_tokens=1)])
    failed = b.fail(WorkerFailed("The worker failed"))
    assert [e["type"] for e in failed] == ["response.failed"]
    assert failed[0]["sequence_number"] == len(events)
    r = failed[0]["response"]
    assert r["status"] == "failed" and r["error"] == {"code": "server_error", "message": "The worker failed"}
    assert r["output"][0]["status"] == "incomplete" and r["output"][0]["content"][0]["text"] == "par"


def test_events_are_snapshots():
    b = builder()
    added = b.start() + b.feed([Delta(0, text="a")])
    b.feed([Delta(0, text="b")])
    b.finish()
    assert added[2]["item"]["status"] == "in_progress" and added[2]["item"]["content"] == []


def test_sse_frames_name_their_event():
    frames = sse([{"type": "response.created", "sequence_number": 0}])
    assert frames == b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'


def test_echo_of_request_parameters():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    r = builder(instructions="sys", tools=[tool], tool_choice="required", text={"format": {"type": "json_object"}},
                reasoning={"effort": "high"}, store=False, user="u1", previous_response_id="resp_0").response()
    assert r["instructions"] == "sys" and r["tools"] == [tool] and r["tool_choice"] == "required"
    assert r["text"] == {"format": {"type": "json_object"}} and r["reasoning"] == {"effort": "high", "summary": None}
    assert r["store"] is False and r["user"] == "u1" and r["previous_response_id"] == "resp_0"
    assert r["parallel_tool_calls"] is True and r["truncation"] == "disabled" and r["background"] is False


def frames(data: bytes) -> list[dict]:
    return [orjson.loads(line.removeprefix(b"data: ")) for line in data.split(b"\n") if line.startswith(b"data: ")]


async def test_the_front_door_renderer_stores_before_the_end_and_says_when_it_could_not():
    """``ResponsesRenderer``: the stream opens with created/in_progress, the response is stored (settled)
    before ``response.completed``; a store that fails after the output went out ends in ``response.failed``
    after the last item's closing events."""
    stored: list[dict] = []

    async def store(b: ResponseObjectBuilder) -> None:
        stored.append(b.response())

    r = ResponsesRenderer(builder(), store)
    first = frames(r.sse([Delta(0, text="hi", prompt_tokens=3, counts_prompt=True, completion_tokens=1)]))
    assert [e["type"] for e in first][:2] == ["response.created", "response.in_progress"]
    await r.complete()
    end = frames(r.sse_end())
    assert end[-1]["type"] == "response.completed" and stored[0]["status"] == "completed"
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (3, 1, 0)

    async def broken(b: ResponseObjectBuilder) -> None:
        raise StoreUnavailable("the response store is unavailable")

    r = ResponsesRenderer(builder(), broken)
    r.sse([Delta(0, text="hi", completion_tokens=1)])
    with pytest.raises(StoreUnavailable) as e:
        await r.complete()
    failed = [ev["type"] for ev in frames(r.sse_error(e.value))]
    assert failed == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                      "response.failed"]


async def _not_stored(b: ResponseObjectBuilder) -> None:
    """A response with store=false: nothing to keep."""


def test_a_folded_response_opens_nothing_and_an_empty_stream_still_opens():
    r = ResponsesRenderer(builder(), _not_stored)
    r.fold([Delta(0, text="x", completion_tokens=1)])
    assert orjson.loads(r.body())["output"][0]["type"] == "message"
    empty = ResponsesRenderer(builder(), _not_stored)
    empty.builder.finish()
    assert [e["type"] for e in frames(empty.sse_end())] == ["response.created", "response.in_progress",
                                                            "response.completed"]
