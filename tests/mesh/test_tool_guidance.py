"""Tool guidance through a live mesh (all-in-one): a mocker registered with ``--dyn-structural-tag on`` and the
hermes format, and a postprocessor with ``--enable-auto-tool-choice``.

A forced tool choice reaches the worker as a structural tag in hermes' own markup (not the generic JSON form),
the mocker writes the call the tag forces, and the postprocessor reads it with the model's parser; a scripted
call in a request without tools is still a tool call (auto tool choice)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import sdk_client, stop_cleanly
from tests.mesh.conftest import DEMO, DEMO_PARSERS, mocker, start_mesh

pytestmark = pytest.mark.mesh

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def guided_mesh(tmp_path_factory, demo_model_dir, envoy_bin, nats_bin):
    m = start_mesh(tmp_path_factory, [mocker(demo_model_dir, DEMO, "200", *DEMO_PARSERS, "--dyn-structural-tag", "on")],
                   inproc=True, service_args={"postprocessor": ("--enable-auto-tool-choice",)})
    yield m
    stop_cleanly(m)


@pytest.fixture
def client(guided_mesh):
    c = sdk_client(guided_mesh, timeout=30)
    yield c
    c.close()


def ask(client, content: str, **kw):
    return client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": content}],
                                          max_tokens=64, **kw).choices[0]


def test_a_named_choice_is_forced_in_the_models_format_and_parsed_as_its_call(client):
    choice = ask(client, "Plan my week.", tools=TOOLS, logprobs=True,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "city value", "days": 1}')
    assert not choice.message.content and choice.finish_reason == "stop"  # named: "stop", as OpenAI
    # What the worker generated (its tokens): hermes' own markup, which only the structural tag asks for (the
    # generic JSON form would be the bare arguments object).
    generated = "".join(t.token for t in choice.logprobs.content)
    assert generated.startswith('<tool_call>\n{"name": "get_weather", "arguments": {')


def test_required_streams_the_tags_first_call(client):
    stream = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Go."}], tools=TOOLS,
                                            tool_choice="required", max_tokens=64, stream=True)
    names = [c.function.name for chunk in stream for d in [chunk.choices[0].delta] if d.tool_calls
             for c in d.tool_calls if c.function and c.function.name]
    assert names == ["get_weather"]


def test_without_tools_auto_tool_choice_still_parses_the_models_call(client):
    choice = ask(client, "What is the weather in Paris?")
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    assert choice.finish_reason == "tool_calls"
    plain = ask(client, "What is the weather in Paris?", tool_choice="none")
    assert plain.message.tool_calls is None and "<tool_call>" in plain.message.content
