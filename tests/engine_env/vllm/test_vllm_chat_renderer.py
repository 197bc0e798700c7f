"""``--chat-processor vllm`` in the preprocessor against vLLM 0.32's own ``LLM.chat``; .venv-vllm only:

    .venv-vllm/bin/python -m pytest -o addopts="--import-mode=importlib" \
        tests/engine_env/vllm/test_vllm_chat_renderer.py

The preprocessor (its real service, the vLLM renderer selected as ``meshfront preprocessor
--chat-processor vllm`` selects it) must give the prompt token ids ``LLM.chat`` gives on the tiny demo
model: a plain chat, a chat with tools, and chat_template_kwargs turning thinking off. ``LLM`` runs
the model on the CPU (about a minute to start), once for the module.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys

import pytest
from meshfront.preprocessor.v1 import preprocessor_pb2
from vllm import LLM, SamplingParams

from services.common.errors import InvalidRequest
from services.launcher.run import VLLM_CPU_KV_CACHE_BYTES
from services.preprocessor.config import parse_config
from services.preprocessor.core.renderers import load_chat_renderer
from services.preprocessor.service import Preprocessor
from tests.engine_env.chat_renderer_setup import NAME, chat_preprocessor, demo_model_dir

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "user", "content": "And in Rome?"},
]
CASES = {
    "plain": (CHAT, None, None),
    "tools": (TOOL_CHAT, TOOLS, None),
    "thinking-off": (CHAT, None, {"enable_thinking": False}),
}


@pytest.fixture(scope="module")
def model_dir() -> str:
    return demo_model_dir(with_weights=True)  # LLM runs it


@pytest.fixture(scope="module")
def llm(model_dir: str) -> LLM:
    return LLM(model=model_dir, kv_cache_memory_bytes=VLLM_CPU_KV_CACHE_BYTES, max_model_len=1024, enforce_eager=True)


@pytest.fixture(scope="module")
def preprocessor(model_dir: str) -> Preprocessor:
    cfg = parse_config(["--chat-processor", "vllm"], env={})
    return chat_preprocessor(model_dir, cfg.chat_processor, 1024)


def preprocess(preprocessor: Preprocessor, messages, tools=None, kwargs=None) -> preprocessor_pb2.PreprocessResponse:
    req = preprocessor_pb2.PreprocessRequest(messages_json=json.dumps(messages),
                                             tools_json=json.dumps(tools) if tools else "",
                                             chat_template_kwargs_json=json.dumps(kwargs) if kwargs else "",
                                             return_formatted_prompt=True)
    req.request.model = NAME
    return asyncio.run(preprocessor.preprocess(req))


def llm_chat_ids(llm: LLM, messages, tools=None, kwargs=None) -> list[int]:
    # A copy: vLLM parses tool-call arguments into dicts in the messages it is given.
    (out,) = llm.chat(copy.deepcopy(messages), SamplingParams(max_tokens=1), use_tqdm=False, tools=tools,
                      chat_template_kwargs=kwargs)
    return list(out.prompt_token_ids)


@pytest.mark.parametrize("case", CASES)
def test_prompt_ids_equal_llm_chats(preprocessor, llm, case):
    messages, tools, kwargs = CASES[case]
    got = preprocess(preprocessor, messages, tools, kwargs)
    assert list(got.request.token_ids) == llm_chat_ids(llm, messages, tools, kwargs)


def test_the_cases_render_differently(preprocessor):
    """What the cases above vouch for: tools and the kwargs reach the template (the demo template writes the
    tools' schemas into the prompt, and an empty think block when thinking is off)."""
    plain = preprocess(preprocessor, CHAT)
    assert "get_weather" in preprocess(preprocessor, TOOL_CHAT, TOOLS).formatted_prompt
    off = preprocess(preprocessor, CHAT, kwargs={"enable_thinking": False})
    assert off.request.token_ids != plain.request.token_ids
    assert off.formatted_prompt.rstrip().endswith("</think>")


def test_a_media_part_is_refused_with_a_400_naming_the_flag(preprocessor):
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(InvalidRequest, match="--chat-processor vllm"):
        preprocess(preprocessor, image)


def test_a_request_vllm_refuses_is_a_400_without_python_names(preprocessor):
    bad = [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                  "function": {"name": "f", "arguments": {"a": 1}}}]}]
    with pytest.raises(InvalidRequest) as refused:
        preprocess(preprocessor, bad)
    assert refused.value.param == "messages"
    assert "Param" not in str(refused.value) and "ChatCompletion" not in str(refused.value)


def test_the_flag_runs_from_this_environment():
    assert load_chat_renderer("vllm").name == "vllm"
    assert sys.modules["vllm"].__version__.startswith("0.32")
