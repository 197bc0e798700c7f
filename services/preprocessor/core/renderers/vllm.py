"""``--chat-processor vllm``: chat requests rendered and tokenized by vLLM's own renderer.

The steps are those of ``vllm serve``'s chat endpoint (vLLM 0.32, ``OnlineRenderer.render_chat`` and
``preprocess_chat``): the request is read as vLLM's ``ChatCompletionRequest``; its tools are dumped as
vLLM dumps them (dropped for tool_choice none when the deployment hides them, as
``--exclude-tools-when-tool-choice-none`` does); ``build_chat_params`` adds ``add_generation_prompt``,
``reasoning_effort`` and the rest; the deployment's ``--default-chat-template-kwargs`` and
``--chat-template`` are already merged under the request's own (service.py); the renderer vLLM picks
for the model (``renderer_from_config``: HF, Mistral, DeepSeek V3.2, ...) renders the messages, and
its tokenizer encodes them. Imported only when selected (services/preprocessor/core/renderers).

Not covered: media content parts (vLLM would fetch and process them here; our gateway already did,
and the worker places them), so a request with media is refused with a 400 naming the flag.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import pydantic
from vllm.config import ModelConfig, VllmConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.exceptions import VLLMValidationError
from vllm.renderers.base import BaseRenderer
from vllm.renderers.registry import renderer_from_config
from vllm.utils.mistral import is_mistral_tokenizer

from services.common.errors import InvalidRequest
from services.preprocessor.core import messages as msgs
from services.preprocessor.core import prompt as core
from services.preprocessor.core.artifacts import ArtifactError, ModelArtifacts
from services.preprocessor.core.templates import prompt_opens_reasoning

log = logging.getLogger(__name__)
# The model name vLLM's request needs; the renderer never reads it (the gateway resolved the model).
_REQUEST_MODEL = "meshfront"
# Content parts vLLM would fetch and process itself (the gateway's media parts).
_MEDIA_PARTS = frozenset({"image_url", "input_audio", "video_url", "audio_url", "image", "audio", "video"})


class VllmChatRenderer:
    """One vLLM renderer per model directory, built on first use (seconds: vLLM reads the model's config)."""

    name = "vllm"

    def __init__(self) -> None:
        self._renderers: dict[str, BaseRenderer] = {}
        self._lock = threading.Lock()

    def warm(self, artifacts: ModelArtifacts) -> None:
        self._renderer(artifacts.model_dir)

    def prepare_chat(self, artifacts: ModelArtifacts, chat: core.ChatInput, context_length: int = 0,
                     max_tokens: int | None = None) -> core.PreparedPrompt:
        renderer = self._renderer(artifacts.model_dir)
        request = _chat_request(chat)
        if request.tools is None or (chat.tool_choice_none and chat.hide_tools_for_choice_none):
            tool_dicts = None
        else:
            tool_dicts = [tool.model_dump() for tool in request.tools]
        defaults = {"tools": tool_dicts, "tokenize": is_mistral_tokenizer(renderer.tokenizer)}
        params = request.build_chat_params(chat.template_override or None, "auto").with_defaults(defaults)
        # The context check is ours (prompt.check_context, after this), with the same message for every
        # renderer; vLLM's own would refuse the same prompts with other words.
        tok_params = dataclasses.replace(renderer.default_chat_tok_params, max_total_tokens=None)
        try:
            _, rendered = renderer.render_messages(request.messages, params)
            (tokenized,) = renderer.tokenize_prompts([rendered], tok_params)
        except VLLMValidationError as e:
            raise InvalidRequest(f"chat template error: {e}", param="messages") from e
        except (ValueError, TypeError, KeyError) as e:  # vLLM's refusals of kwargs and message shapes
            log.info("vLLM's renderer refused a request's messages: %r", e)
            raise InvalidRequest(f"the chat cannot be rendered: {e}", param="messages") from e
        ids = list(tokenized["prompt_token_ids"])
        text = rendered.get("prompt")
        if not isinstance(text, str):  # a renderer that tokenizes itself (Mistral's): ids only
            text = renderer.get_tokenizer().decode(ids)
        return core.PreparedPrompt(ids, prompt_opens_reasoning(text), text)

    def _renderer(self, model_dir: str) -> BaseRenderer:
        found = self._renderers.get(model_dir)
        if found is not None:
            return found
        with self._lock:
            found = self._renderers.get(model_dir)
            if found is None:
                try:
                    config = VllmConfig(model_config=ModelConfig(model=model_dir, tokenizer=model_dir))
                    found = renderer_from_config(config)
                except (ValueError, RuntimeError) as e:  # vLLM's words for a config or tokenizer it cannot read
                    raise ArtifactError(f"vLLM cannot build a renderer for {model_dir}: {e}") from e
                log.info("vLLM's %s renders chats of %s", type(found).__name__, model_dir)
                self._renderers[model_dir] = found
            return found


def _chat_request(chat: core.ChatInput) -> ChatCompletionRequest:
    """The chat as vLLM's endpoint reads it (its validation, its defaults)."""
    body: dict[str, Any] = {"model": _REQUEST_MODEL,
                            "messages": msgs.parse_json(chat.messages_json, "messages", "messages")}
    if chat.tools_json:
        body["tools"] = msgs.parse_json(chat.tools_json, "tools", "tools")
        if chat.tool_choice_none:
            body["tool_choice"] = "none"
    if chat.chat_template_kwargs_json:
        body["chat_template_kwargs"] = msgs.parse_json(chat.chat_template_kwargs_json, "chat_template_kwargs",
                                                       "chat_template_kwargs")
    if any(isinstance(m, dict) and isinstance(m.get("content"), list)
           and any(isinstance(p, dict) and p.get("type") in _MEDIA_PARTS for p in m["content"])
           for m in body["messages"]):
        raise _media_refused()
    try:
        return ChatCompletionRequest.model_validate(body)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        # The location without the union members' class names (ChatCompletionMessage...Param): no Python
        # name reaches a client.
        where = ".".join(str(x) for x in first["loc"] if not (isinstance(x, str) and x[:1].isupper()))
        param = next((x for x in first["loc"] if x in body), "messages")
        raise InvalidRequest(f"{where}: {first['msg']}" if where else first["msg"], param=str(param)) from e


def _media_refused() -> InvalidRequest:
    return InvalidRequest("this deployment renders chats with vLLM's renderer (--chat-processor vllm), which does "
                          "not take image, audio or video content yet", param="messages",
                          code="unsupported_modality")


CHAT_RENDERER_CLASS = VllmChatRenderer
