"""The Preprocessor puts a card's structural tag and Kimi's history count on what it sends on."""

from __future__ import annotations

import asyncio
import json

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2

from services.common.discovery import ModelCard
from services.preprocessor.core.artifacts import ArtifactCache
from services.preprocessor.service import Preprocessor

pytestmark = pytest.mark.unit

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
HISTORY = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "Sunny"},
           {"role": "user", "content": "And in Paris?"}]
REQUIRED = common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_REQUIRED)


@pytest.fixture(scope="module")
def cache():
    return ArtifactCache()


def preprocess(demo_model_dir, cache, choice=REQUIRED, guided=None, **card) -> preprocessor_pb2.PreprocessResponse:
    model = ModelCard(name="demo", model_dir=str(demo_model_dir), tool_call_parser="hermes", **card)
    sampling = common_pb2.SamplingOptions(guided_decoding=guided) if guided is not None else None
    req = preprocessor_pb2.PreprocessRequest(
        request=common_pb2.PreprocessedRequest(request_id="r1", model="demo", sampling=sampling),
        messages_json=json.dumps(HISTORY), tools_json=json.dumps(TOOLS), tool_choice=choice, single_call=True)
    return asyncio.run(Preprocessor({"demo": model}.get, cache).preprocess(req))


def test_a_card_with_tags_on_replaces_a_forced_choices_json_form(demo_model_dir, cache):
    gateway_json = common_pb2.GuidedDecoding(json_schema='{"type": "array"}')
    out = preprocess(demo_model_dir, cache, guided=gateway_json, structural_tag_mode="on")
    guided = out.request.sampling.guided_decoding
    assert not guided.json_schema
    tag = json.loads(guided.structural_tag)["format"]
    assert tag["type"] == "tags_with_separator" and tag["stop_after_first"]  # single_call: parallel calls off
    assert tag["tags"][0]["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert out.postprocess.tool_calls_in_model_format
    assert out.postprocess.history_tool_calls == 1


def test_tags_off_keeps_the_gateways_guidance(demo_model_dir, cache):
    gateway_json = common_pb2.GuidedDecoding(json_schema='{"type": "array"}')
    out = preprocess(demo_model_dir, cache, guided=gateway_json)
    assert out.request.sampling.guided_decoding == gateway_json
    assert not out.postprocess.tool_calls_in_model_format


def test_auto_gets_a_tag_and_the_model_format_flag_stays_off(demo_model_dir, cache):
    out = preprocess(demo_model_dir, cache, choice=common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_AUTO),
                     structural_tag_mode="on", structural_tag_scope="always")
    assert json.loads(out.request.sampling.guided_decoding.structural_tag)["format"]["type"] == "triggered_tags"
    assert not out.postprocess.tool_calls_in_model_format  # auto is parsed by the model's parser anyway
