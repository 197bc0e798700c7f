"""The gateway's Dynamo API switches as pure code: their flags and env twins, the billing-preamble strip,
the reasoning field's name and the streaming dispatch events (services/gateway/openai/dispatch.py).

The same switches through a real gateway: tests/service/gateway/test_api_switches.py and
tests/mesh/test_gateway_switches.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from meshfront.postprocessor.v1 import postprocessor_pb2

from services.gateway.anthropic.request import parse_count_tokens, parse_messages, strip_billing_preamble
from services.gateway.config import ApiSwitches, parse_config
from services.gateway.core.delta import Delta
from services.gateway.openai.dispatch import ChatOutput, Dispatcher, DispatchingChatRenderer
from services.gateway.openai.render import ChatRenderer

pytestmark = pytest.mark.unit

BILLING = "x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=0f3e9;"


def test_defaults_are_meshfronts_and_every_switch_takes_dynamos_flag_and_env_twin():
    assert parse_config([], env={}).api_switches() == ApiSwitches()
    flags = parse_config(["--reasoning-field-name", "reasoning", "--no-enable-anthropic-api",
                          "--no-strip-anthropic-preamble", "--no-kserve-grpc-server",
                          "--enable-streaming-tool-dispatch", "--enable-streaming-reasoning-dispatch"], env={})
    everything_flipped = ApiSwitches("reasoning", False, False, False, True, True)
    assert flags.api_switches() == everything_flipped
    env = {"DYN_REASONING_FIELD_NAME": "reasoning", "DYN_ENABLE_ANTHROPIC_API": "false",
           "DYN_STRIP_ANTHROPIC_PREAMBLE": "0", "DYN_KSERVE_GRPC_SERVER": "off",
           "DYN_ENABLE_STREAMING_TOOL_DISPATCH": "true", "DYN_ENABLE_STREAMING_REASONING_DISPATCH": "1"}
    assert parse_config([], env=env).api_switches() == everything_flipped
    # Meshfront's own twin wins over Dynamo's, and the flag over both.
    assert parse_config([], env={"MESHFRONT_GATEWAY_ENABLE_ANTHROPIC_API": "true",
                                 "DYN_ENABLE_ANTHROPIC_API": "false"}).enable_anthropic_api
    assert parse_config(["--enable-anthropic-api"], env={"DYN_ENABLE_ANTHROPIC_API": "false"}).enable_anthropic_api


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--reasoning-field-name", "thoughts"], {}, "invalid choice: 'thoughts'"),
    ([], {"DYN_REASONING_FIELD_NAME": "thoughts"}, "DYN_REASONING_FIELD_NAME='thoughts'"),
    ([], {"DYN_KSERVE_GRPC_SERVER": "maybe"}, "DYN_KSERVE_GRPC_SERVER='maybe'"),
])
def test_a_bad_value_is_one_line_and_exit_status_2(capsys, argv, env, needle):
    with pytest.raises(SystemExit) as e:
        parse_config(argv, env=env)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1


@pytest.mark.parametrize(("system", "stripped"), [
    (f"{BILLING}\nYou are Claude Code.", "You are Claude Code."),
    (f"  \n{BILLING}\nYou are Claude Code.\nSecond line.", "You are Claude Code.\nSecond line."),
    (BILLING, BILLING),  # nothing after the line: left as it is (Dynamo's rule)
    (f"You are Claude Code.\n{BILLING}\n", f"You are Claude Code.\n{BILLING}\n"),  # not at the start
    ("X-Anthropic-Billing-Header: a\nrest", "X-Anthropic-Billing-Header: a\nrest"),  # the exact spelling only
])
def test_strip_billing_preamble(system, stripped):
    assert strip_billing_preamble(system) == stripped


def _claude_code_body(system, **extra) -> bytes:
    return orjson.dumps({"model": "m", "system": system, "messages": [{"role": "user", "content": "hi"}], **extra})


def test_the_billing_text_block_leaves_the_system_prompt_when_stripping():
    blocks = [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are Claude Code.",
                                                  "cache_control": {"type": "ephemeral"}}]
    body = _claude_code_body(blocks, max_tokens=8)
    assert parse_messages(body, strip_preamble=True).messages[0] == {"role": "system",
                                                                      "content": "You are Claude Code."}
    assert parse_messages(body).messages[0]["content"] == f"{BILLING}\nYou are Claude Code."
    assert parse_count_tokens(_claude_code_body(blocks), strip_preamble=True).messages[0]["content"] == \
        "You are Claude Code."
    # A system prompt that was only the line and its newline is no system prompt.
    only = parse_messages(_claude_code_body(f"{BILLING}\n", max_tokens=8), strip_preamble=True)
    assert [m["role"] for m in only.messages] == ["user"]


def tool_call(index: int, arguments: str, call_id: str = "", name: str = "") -> postprocessor_pb2.ToolCallDelta:
    return postprocessor_pb2.ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments)


def events(data: bytes) -> list[tuple[str, dict]]:
    """The named events of an SSE buffer, in order, with their JSON payloads."""
    out = []
    for frame in data.split(b"\n\n"):
        if frame.startswith(b"event: "):
            name, payload = frame.split(b"\n", 1)
            out.append((name[len(b"event: "):].decode(), orjson.loads(payload[len(b"data: "):])))
    return out


def test_reasoning_field_names_the_delta_and_the_message_field():
    kw = dict(request_id="c", model="m", n_choices=1, want_logprobs=False, include_usage=False)
    deltas = [Delta(0, reasoning="Two plus two."), Delta(0, text="4"), Delta(0, text=".", finish_reason="stop")]
    for field, other in (("reasoning", "reasoning_content"), ("reasoning_content", "reasoning")):
        streamed = ChatOutput(field).renderer(True, **kw)
        frames = [orjson.loads(f[len(b"data: "):]) for f in streamed.sse(deltas).split(b"\n\n") if f]
        assert frames[0]["choices"][0]["delta"][field] == "Two plus two."
        assert all(other not in f["choices"][0]["delta"] for f in frames)
        whole = ChatOutput(field).renderer(False, **kw)
        whole.fold(deltas)
        message = orjson.loads(whole.body())["choices"][0]["message"]
        assert message[field] == "Two plus two." and other not in message and message["content"] == "4."


def test_plain_renderer_unless_a_streamed_request_asks_for_events():
    kw = dict(request_id="c", model="m", n_choices=1, want_logprobs=False, include_usage=False)
    assert type(ChatOutput(tool_dispatch=True).renderer(False, **kw)) is ChatRenderer
    assert type(ChatOutput().renderer(True, **kw)) is ChatRenderer
    assert type(ChatOutput(reasoning_dispatch=True).renderer(True, **kw)) is DispatchingChatRenderer


def test_each_tool_call_is_dispatched_once_complete_before_the_chunk_that_shows_it():
    r = DispatchingChatRenderer(tool_calls=True, reasoning=True, request_id="c", model="m", n_choices=1,
                                want_logprobs=False, include_usage=False)
    first = r.sse([Delta(0, reasoning="Paris, then "), Delta(0, reasoning="Rome."),
                   Delta(0, tool_calls=[tool_call(0, '{"city": ', "call_a", "get_weather")])])
    # Thinking ended where the first call began: its event comes before that call's chunk, the call's
    # own is not out yet (its arguments may go on).
    assert events(first) == [("reasoning_dispatch", {"index": 0, "reasoning_content": "Paris, then Rome."})]
    assert first.index(b"event: reasoning_dispatch") < first.index(b'"call_a"')
    second = r.sse([Delta(0, tool_calls=[tool_call(0, '"Paris"}')]),
                    Delta(0, tool_calls=[tool_call(1, '{"city": "Rome"', "call_b", "get_weather")])])
    call_a = {"index": 0, "id": "call_a", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert events(second) == [("tool_call_dispatch", {"choice_index": 0, "tool_call": call_a})]
    assert second.index(b"event: tool_call_dispatch") < second.index(b'"call_b"')
    last = r.sse([Delta(0, tool_calls=[tool_call(1, "}")], finish_reason="tool_calls")])
    assert events(last) == [("tool_call_dispatch", {"choice_index": 0, "tool_call": {
        "index": 1, "id": "call_b", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}})]
    assert last.index(b"event: ") < last.index(b'"finish_reason":"tool_calls"')
    assert r.sse_end() == b"data: [DONE]\n\n"  # nothing left over, nothing twice


def test_reasoning_dispatch_waits_for_evidence_and_keeps_choices_apart():
    d = Dispatcher(2, tool_calls=False, reasoning=True)
    assert d.before(Delta(0, reasoning="a")) == b""
    assert d.before(Delta(1, reasoning="x")) == b""
    assert d.before(Delta(0)) == b""  # an empty delta (text held back) does not end the reasoning
    assert d.before(Delta(0, reasoning="b", text="answer")) == \
        b'event: reasoning_dispatch\ndata: {"index":0,"reasoning_content":"ab"}\n\n'
    assert d.before(Delta(0, text="more", finish_reason="stop")) == b""  # once per block
    assert events(d.before(Delta(1, reasoning="y", finish_reason="length"))) == [
        ("reasoning_dispatch", {"index": 1, "reasoning_content": "xy"})]  # cut off while thinking: still sent


def _chunks(data: bytes) -> list[dict]:
    """The data frames' JSON, ``created`` left out (two renderers may be made a second apart)."""
    chunks = [orjson.loads(f[len(b"data: "):]) for f in data.split(b"\n\n") if f.startswith(b"data: {")]
    return [{k: v for k, v in c.items() if k != "created"} for c in chunks]


def test_only_the_switched_on_events_and_the_chunks_stay_the_plain_renderers():
    kw: dict[str, Any] = dict(request_id="c", model="m", n_choices=1, want_logprobs=False, include_usage=True)
    deltas = [Delta(0, reasoning="hm", prompt_tokens=3, counts_prompt=True, completion_tokens=1),
              Delta(0, tool_calls=[tool_call(0, "{}", "call_a", "f")], completion_tokens=1),
              Delta(0, finish_reason="tool_calls")]
    plain, tools_only = ChatRenderer(**kw), DispatchingChatRenderer(tool_calls=True, reasoning=False, **kw)
    with_events, without = tools_only.sse(deltas), plain.sse(deltas)
    assert [name for name, _ in events(with_events)] == ["tool_call_dispatch"]
    assert _chunks(with_events) == _chunks(without) and len(_chunks(without)) == 3
    assert _chunks(tools_only.sse_end()) == _chunks(plain.sse_end()) and tools_only.usage() == plain.usage()
