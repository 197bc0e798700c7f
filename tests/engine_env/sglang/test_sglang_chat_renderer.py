"""``--chat-processor sglang`` in the preprocessor against SGLang 0.5.23's own chat handler; .venv-sglang only:

    .venv-sglang/bin/python -m pytest -o addopts="--import-mode=importlib" \
        tests/engine_env/sglang/test_sglang_chat_renderer.py

The oracle is what SGLang's server would hand its scheduler for the same client body: its process
config published, its tokenizer manager and templates built by its own ``engine.init_tokenizer_manager``
(the whole manager, sockets and all: nothing answers them, and nothing is sent), its
``OpenAIServingChat`` validating and converting the request the OpenAI SDK would send. The preprocessor
(its real service, the renderer selected as ``meshfront preprocessor --chat-processor sglang`` selects
it) gets the same chat as the gateway's gRPC request and must give the same prompt ids on the demo
model: a plain chat, tools, ``enable_thinking: false``, a multi-turn with tool results, a named
tool_choice, tool_choice none, and a trailing assistant turn. No model runs (SGLang needs none to render).
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from meshfront.common.v1 import common_pb2
from meshfront.preprocessor.v1 import preprocessor_pb2
from sglang.srt.entrypoints.engine import init_tokenizer_manager
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.runtime_context import publish
from sglang.srt.server_args import PortArgs, ServerArgs

from services.common.errors import InvalidRequest
from services.preprocessor.config import parse_config
from services.preprocessor.core.renderers import load_chat_renderer
from services.preprocessor.service import Preprocessor
from tests.engine_env.chat_renderer_setup import NAME, chat_preprocessor, demo_model_dir

CONTEXT = 4096
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny."},
    {"role": "user", "content": "And in Rome, and what time is it there?"},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
# name -> the OpenAI client's body (less model and messages' copies)
CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": CHAT},
    "tools": {"messages": CHAT, "tools": [WEATHER]},
    "thinking-off": {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}},
    "multi-turn-tool-results": {"messages": TOOL_CHAT, "tools": [WEATHER, CLOCK]},
    "named-tool-choice": {"messages": TOOL_CHAT, "tools": [WEATHER, CLOCK], "tool_choice": NAMED},
    "tool-choice-none": {"messages": TOOL_CHAT, "tools": [WEATHER, CLOCK], "tool_choice": "none"},
    "trailing-assistant": {"messages": [*CHAT, {"role": "assistant", "content": "Four"}]},
}


@pytest.fixture(scope="module")
def model_dir() -> str:
    return demo_model_dir()  # no weights needed


@pytest.fixture(scope="module")
def sglang_chat(model_dir: str) -> OpenAIServingChat:
    """SGLang's chat handler as its server builds it (http_server / engine.py), without a scheduler."""
    server_args = ServerArgs(model_path=model_dir, device="cpu")
    publish(server_args, role="tokenizer")
    tokenizer_manager, template_manager = init_tokenizer_manager(server_args, PortArgs.init_new(server_args))
    return OpenAIServingChat(tokenizer_manager, template_manager)


@pytest.fixture(scope="module")
def preprocessor(model_dir: str) -> Preprocessor:
    cfg = parse_config(["--chat-processor", "sglang"], env={})
    return chat_preprocessor(model_dir, cfg.chat_processor, CONTEXT)


def preprocess(preprocessor: Preprocessor, body: dict[str, Any]) -> preprocessor_pb2.PreprocessResponse:
    """The body as the gateway hands it to the preprocessor."""
    req = preprocessor_pb2.PreprocessRequest(
        messages_json=json.dumps(body["messages"]), tools_json=json.dumps(body["tools"]) if "tools" in body else "",
        chat_template_kwargs_json=json.dumps(body["chat_template_kwargs"]) if "chat_template_kwargs" in body else "",
        return_formatted_prompt=True)
    choice = body.get("tool_choice")
    if choice == "none":
        req.tool_choice.mode = common_pb2.TOOL_CHOICE_MODE_NONE
    elif isinstance(choice, dict):
        req.tool_choice.mode = common_pb2.TOOL_CHOICE_MODE_NAMED
        req.tool_choice.function_name = choice["function"]["name"]
    req.request.model = NAME
    return asyncio.run(preprocessor.preprocess(req))


def sglang_ids(serving: OpenAIServingChat, body: dict[str, Any]) -> list[int]:
    """The input_ids SGLang's /v1/chat/completions would send its scheduler for this client body."""
    request = ChatCompletionRequest.model_validate({"model": NAME, **copy.deepcopy(body)})
    assert serving._validate_request(request) is None
    adapted, _ = serving._convert_to_internal_request(request)
    return list(adapted.input_ids)


@pytest.mark.parametrize("case", CASES)
def test_prompt_ids_equal_sglangs_own(preprocessor, sglang_chat, case):
    got = preprocess(preprocessor, CASES[case])
    assert list(got.request.token_ids) == sglang_ids(sglang_chat, CASES[case])


def test_the_cases_render_differently(preprocessor):
    """What the cases above vouch for: each reaches the template (the demo template writes the tools'
    schemas into the prompt, and an empty think block when thinking is off)."""
    prompt = {case: preprocess(preprocessor, body).formatted_prompt for case, body in CASES.items()}
    assert "get_weather" in prompt["tools"] and "get_weather" not in prompt["plain"]
    assert prompt["thinking-off"].rstrip().endswith("</think>") and not prompt["plain"].rstrip().endswith("</think>")
    assert "get_time" in prompt["multi-turn-tool-results"] and "<tool_response>" in prompt["multi-turn-tool-results"]
    # SGLang shows a named choice's template only that tool, and none of them for tool_choice none.
    assert '"name": "get_weather", "description"' not in prompt["named-tool-choice"]
    assert '"name": "get_time", "description"' in prompt["named-tool-choice"]
    assert "<tools>" not in prompt["tool-choice-none"]
    # SGLang turns a trailing assistant message into a user turn (no continue_final_message).
    assert "<|im_start|>user\nFour<|im_end|>" in prompt["trailing-assistant"]


def test_the_deployments_showing_tools_for_tool_choice_none_is_kept(model_dir):
    """--no-exclude-tools-when-tool-choice-none: the template sees the tools, as with ours."""
    showing = chat_preprocessor(model_dir, "sglang", CONTEXT, hide_tools_for_choice_none=False)
    assert "<tools>" in preprocess(showing, CASES["tool-choice-none"]).formatted_prompt


def test_the_deployments_template_renders_and_a_prompt_opening_think_is_flagged(model_dir, preprocessor):
    """--chat-template reaches SGLang (as its own --chat-template file), and a prompt it ends inside an
    opened <think> tells the postprocessor that output starts as reasoning."""
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    thinking = chat_preprocessor(model_dir, "sglang", CONTEXT, chat_template=template)
    got = preprocess(thinking, CASES["plain"])
    assert got.formatted_prompt == ("<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
                                    "<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert got.postprocess.prompt_opens_reasoning is True
    assert preprocess(preprocessor, CASES["plain"]).postprocess.prompt_opens_reasoning is False


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{not json"}}]}, {"role": "user", "content": "hi"}]},
     "messages", "function.arguments must be valid JSON"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools", "invalid 'parameters' schema"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages", "messages.0"),
    ({"messages": CHAT, "chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}, "chat_template_kwargs",
     "may not set chat_template"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "messages",
     "--chat-processor sglang"),
])
def test_a_request_sglang_refuses_is_a_400_without_python_names(preprocessor, body, param, words):
    with pytest.raises(InvalidRequest) as refused:
        preprocess(preprocessor, body)
    assert refused.value.param == param and words in str(refused.value)
    assert "Param" not in str(refused.value) and "ChatCompletion" not in str(refused.value)


@pytest.mark.parametrize(("template", "words"), [
    ("{{ raise_exception('only user turns, please') }}", "chat template error: only user turns, please"),
    ("{{ messages[0].nothing.deeper }}", "the model's chat template cannot render these messages"),
])
def test_a_template_failure_is_a_400_in_our_words(model_dir, template, words):
    """The template author's raise_exception reaches the client; Jinja's own text ('dict object' has no
    attribute ...) does not."""
    failing = chat_preprocessor(model_dir, "sglang", CONTEXT, chat_template=template)
    with pytest.raises(InvalidRequest) as refused:
        preprocess(failing, CASES["plain"])
    assert refused.value.param == "messages" and str(refused.value).startswith(words)
    assert "object" not in str(refused.value)


def test_the_flag_runs_from_this_environment():
    import sglang

    assert load_chat_renderer("sglang").name == "sglang"
    assert sglang.__version__ == "0.5.23"
