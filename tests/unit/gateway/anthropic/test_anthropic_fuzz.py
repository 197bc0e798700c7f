"""Fuzzed Anthropic bodies: every one is either carried to a rendered, tokenized prompt or a 400 naming a field.

Hypothesis builds bodies from Anthropic's field names (top level, content blocks, tools, tool_choice,
thinking, output_config) with values of every JSON type, valid ones included. Each goes through the
gateway's parser, the proto conversion and the preprocessor's real chat rendering with the demo
model's template and tokenizer. Any exception other than ``InvalidRequest`` would be a 5xx at the edge.
"""

from __future__ import annotations

import functools
import json

import pytest
from meshfront.common.v1 import common_pb2

from services.common.errors import InvalidRequest
from services.gateway.anthropic.request import parse_count_tokens, parse_messages
from services.gateway.core.to_proto import chat_to_preprocess
from services.models import default_test_model_dir
from services.preprocessor.core import prompt as core
from services.preprocessor.core.artifacts import ArtifactCache
from tests.conftest import require_module

pytestmark = pytest.mark.unit

hypothesis = require_module("hypothesis")
st = hypothesis.strategies

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=6)


SCHEMA = st.sampled_from([{"type": "object"}, {"type": "object", "properties": {"city": {"type": "string"}}}])
text_block = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)},
                                   optional={"cache_control": st.just({"type": "ephemeral"})})
tool_use = st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("call_1"),
                                  "name": st.sampled_from(["get_weather", "get_time"]),
                                  "input": st.dictionaries(st.text(max_size=4), scalars, max_size=2)})
tool_result = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": st.just("call_1")},
    optional={"content": st.one_of(st.text(max_size=8), st.lists(text_block, max_size=2)),
              "is_error": st.booleans()})
thinking_block = st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=8),
                                        "signature": st.just("")})
user_content = st.one_of(st.text(min_size=1, max_size=10), st.lists(st.one_of(text_block, tool_result), min_size=1,
                                                                    max_size=3))
assistant_content = st.one_of(st.text(max_size=10), st.lists(st.one_of(text_block, tool_use, thinking_block),
                                                             min_size=1, max_size=3))
turn = st.one_of(st.fixed_dictionaries({"role": st.just("user"), "content": user_content}),
                 st.fixed_dictionaries({"role": st.just("assistant"), "content": assistant_content}))
messages = st.lists(turn, max_size=4).map(lambda ms: [*ms, {"role": "user", "content": "hi"}])
tool = st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "get_time"]), "input_schema": SCHEMA},
                             optional={"description": st.text(max_size=8), "type": st.just("custom")})
VALID = {
    "max_tokens": st.integers(1, 4096),
    "system": st.one_of(st.text(max_size=10), st.lists(text_block, max_size=2)),
    "tools": st.lists(tool, max_size=2, unique_by=lambda t: t["name"]),
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "none"])},
                                         optional={"disable_parallel_tool_use": st.booleans()}),
    "stop_sequences": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "temperature": st.floats(0, 1), "top_p": st.floats(0, 1), "top_k": st.integers(1, 50),
    "stream": st.booleans(), "metadata": st.fixed_dictionaries({"user_id": st.text(max_size=5)}),
    "thinking": st.one_of(st.just({"type": "disabled"}), st.just({"type": "adaptive"})),
    "output_config": st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "high"]),
                                                         "format": st.fixed_dictionaries(
                                                             {"type": st.just("json_schema"), "schema": SCHEMA})}),
    "cache_control": st.just({"type": "ephemeral"}), "service_tier": st.just("auto"),
}
# Where a wild value may land: any top-level field (known or not) or a spot inside the structures.
WILD_SPOTS = [*VALID, "model", "messages", "bogus", "messages.0.content", "messages.-1.content", "messages.-1.role",
              "tools.0.input_schema", "tools.0.name", "system.0.text", "thinking.budget_tokens", "tool_choice.type",
              "output_config.format.schema", "metadata.user_id"]


def _is_index(key: str) -> bool:
    return key.lstrip("-").isdigit()


def _plant(body: dict, spot: str, value) -> None:
    """Sets ``value`` at the dotted ``spot`` when the path exists (an earlier plant may have replaced it)."""
    *path, last = spot.split(".")
    node = body
    for key in path:
        if isinstance(node, list) and node and _is_index(key):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return
    if isinstance(node, list) and node and _is_index(last):
        node[int(last)] = value
    elif isinstance(node, dict) and not _is_index(last):
        node[last] = value


@st.composite
def bodies(draw):
    """A valid body with up to five optional fields, and at most two wild values planted in it.

    """
    body = {"model": "m", "messages": draw(messages), "max_tokens": draw(VALID["max_tokens"])}
    for key in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=5, unique=True)):
        body[key] = draw(VALID[key])
    for spot in draw(st.lists(st.sampled_from(WILD_SPOTS), max_size=2, unique=True)):
        _plant(body, spot, draw(json_values))
    return body


@functools.cache
def artifacts():
    return ArtifactCache().get(str(default_test_model_dir()))


def carry(parse, body: dict) -> None:
    try:
        # json, not orjson: integers past 64 bits and NaN must reach the parser as a client sends them.
        req = parse(json.dumps(body).encode())
        prep = chat_to_preprocess(req, "rid")
        chat = core.ChatInput(prep.messages_json, prep.tools_json,
                              prep.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_NONE,
                              prep.chat_template_kwargs_json)
        assert core.prepare_chat(artifacts(), chat).token_ids
    except InvalidRequest as e:
        assert e.http_status == 400 and e.message


@hypothesis.settings(max_examples=1500, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(body=bodies())
def test_fuzzed_messages_bodies_are_carried_or_a_400(body):
    carry(parse_messages, body)


@hypothesis.settings(max_examples=400, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(body=bodies())
def test_fuzzed_count_tokens_bodies_are_carried_or_a_400(body):
    generation_only = {"max_tokens", "temperature", "top_p", "top_k", "stream", "stop_sequences", "metadata",
                       "service_tier"}
    carry(parse_count_tokens, {k: v for k, v in body.items() if k not in generation_only})
