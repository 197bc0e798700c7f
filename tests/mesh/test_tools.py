"""Tool calls, reasoning and structured output end to end: openai SDK → Envoy → mesh → mocker.

The demo model's workers register the hermes tool-call and qwen3 reasoning parsers; the mocker's
script (tests/golden/mocker_script.json) makes the model "say" a tool call for the weather question
and answer once the tool's result is in the prompt.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.mesh.conftest import DEMO

pytestmark = pytest.mark.mesh

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGS = {"city": "Paris", "unit": "°C"}
REASONING = "The user wants the weather; I should call get_weather."


def _follow_up(call_id: str, arguments: str) -> list[dict]:
    return [*QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"sky": "sunny", "temp_c": 21})}]


def test_tool_call_round_trip_non_stream(client):
    r = client.chat.completions.create(model=DEMO, messages=QUESTION, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.reasoning_content == REASONING  # extra field, kept by the SDK
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGS
    answer = client.chat.completions.create(model=DEMO, messages=_follow_up(call.id, call.function.arguments),
                                            tools=TOOLS)
    assert answer.choices[0].message.content == "It is sunny and 21 °C in Paris."
    assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls


def test_tool_call_round_trip_stream(client):
    chunks = list(client.chat.completions.create(model=DEMO, messages=QUESTION, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or ()]
    headers = [tc for tc in calls if tc.id]
    assert len(headers) == 1 and headers[0].function.name == "get_weather" and headers[0].type == "function"
    assert all(tc.index == 0 for tc in calls)
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == ARGS
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == REASONING
    assert "".join(d.content or "" for d in deltas) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    answer = client.chat.completions.create(model=DEMO, messages=_follow_up(headers[0].id, arguments), tools=TOOLS,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices) == "It is sunny and 21 °C in Paris."


def test_reasoning_content_is_split_from_content(client):
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "What is 2+2?"}])
    assert r.choices[0].message.reasoning_content == "Two plus two is four."
    assert r.choices[0].message.content == "2 + 2 = 4."
    stream = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "What is 2+2?"}],
                                            stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Two plus two is four."
    assert "".join(d.content or "" for d in deltas) == "2 + 2 = 4."


def test_tool_choice_named_is_forced_through_guided_decoding(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Count to ten"}],
                                       tools=TOOLS, tool_choice=named)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    assert r.choices[0].finish_reason == "stop"  # OpenAI keeps stop for a named tool_choice


def test_tool_choice_required_stream(client):
    chunks = list(client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Count to ten"}],
                                                 tools=TOOLS, tool_choice="required", stream=True))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [tc.function.name for tc in calls if tc.id] == ["get_weather"]
    jsonschema.validate(json.loads("".join(tc.function.arguments or "" for tc in calls)),
                        TOOLS[0]["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 4},
                                               "why": {"type": "string", "minLength": 3}},
              "required": ["answer", "why"], "additionalProperties": False}
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Say hello"}],
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "result", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Say hello"}],
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_bad_schema_and_unknown_tool_are_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=QUESTION, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DEMO, messages=QUESTION, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


COMPARE = [{"role": "user", "content": "Compare Paris and Rome, please."}]


def _cities(calls) -> list[str]:
    return [json.loads(c.function.arguments)["city"] for c in calls]


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_returns_one_call(client, stream):
    def run(**kw):
        if not stream:
            r = client.chat.completions.create(model=DEMO, messages=COMPARE, tools=TOOLS, **kw)
            return r.choices[0].message.tool_calls, r.choices[0].finish_reason
        calls: dict[int, list] = {}
        finish = None
        for chunk in client.chat.completions.create(model=DEMO, messages=COMPARE, tools=TOOLS, stream=True, **kw):
            for tc in chunk.choices[0].delta.tool_calls or []:
                calls.setdefault(tc.index, []).append(tc)
            finish = chunk.choices[0].finish_reason or finish
        merged = [type("Call", (), {"function": type("F", (), {
            "arguments": "".join(p.function.arguments or "" for p in parts)})()}) for _, parts in sorted(calls.items())]
        return merged, finish

    both, finish = run()
    assert _cities(both) == ["Paris", "Rome"] and finish == "tool_calls"
    one, finish = run(parallel_tool_calls=False)
    assert _cities(one) == ["Paris"] and finish == "tool_calls"
