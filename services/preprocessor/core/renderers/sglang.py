"""``--chat-processor sglang``: chat requests rendered and tokenized by SGLang's own chat handler.

What SGLang 0.5.23's ``/v1/chat/completions`` does between reading a request and handing the scheduler
its ids runs here unchanged: the request is read as SGLang's ``ChatCompletionRequest``; its
``OpenAIServingChat`` validates it (``_validate_request``: tool names and schemas, tool_choice) and
converts it (``_convert_to_internal_request``, then ``_process_messages`` / ``_apply_jinja_template``):
``reasoning_effort`` out of the kwargs, tools dropped for tool_choice none and narrowed to a named
choice, tool-call arguments parsed back into objects, content parts flattened to the template's
detected content format, a trailing assistant turn handled as SGLang handles it, the model's reasoning
toggle and content format read from its template by SGLang's ``TemplateManager``, SGLang's Python
chat templates and encoders (DeepSeek V3.2, Kimi, ...) where it has one for the model, and its
tokenizer (loaded by SGLang's ``get_tokenizer``, with its quirks). The ids are the ``input_ids`` of
the ``GenerateReqInput`` it builds.

What is reused, and why not more: ``OpenAIServingChat`` needs a ``TokenizerManager``, whose constructor
binds the scheduler's ZMQ sockets and starts watchdog and metrics machinery, none of which a renderer
needs. ``_TokenizerHalf`` is SGLang's own class with only the two init steps of its constructor that
load the model config and the tokenizer (``init_model_config``, ``init_tokenizer_and_processor``), so
the serving class sees the very objects SGLang's server gives it. The ``TemplateManager`` is built as
SGLang's ``engine.init_tokenizer_manager`` builds it. SGLang reads its config from process-wide bags
(``runtime_context``): each model directory gets its own context (``create_context``), entered with
``use_context`` around every use; that swap is process-global, so uses are serialized by one lock.
SGLang's resolution of its arguments needs a device, and ``cpu`` is given: no model runs here.

The deployment's ``--default-chat-template-kwargs`` are already merged under the request's own
(service.py), as SGLang's flag of that name merges them; ``--chat-template`` is handed to SGLang as a
template file (its ``--chat-template``), whose handler is built on the first request that uses it
(``warm`` knows only the model directory). SGLang always hides the tools for tool_choice none; a deployment
that shows them (``--no-exclude-tools-when-tool-choice-none``) gets them by not sending ``none``, which
only the template sees here (tool-call grammars are the workers'). Not covered: SGLang's
``--tool-call-parser`` / ``--reasoning-parser`` are not set (the parsers are the postprocessor's), which
changes rendering only for the few models SGLang special-cases by parser (GLM-4.7, Kimi K3, Hunyuan
efforts, non-Jinja conversation templates' ``<think>``); media content parts are refused with a 400
naming the flag (SGLang would fetch them here; our gateway already did, and the worker places them).
Imported only when selected (services/preprocessor/core/renderers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

# SGLang's model-config registry imports torchvision at import time (vision models' preprocessing).
# PyPI's torchvision is built against the CUDA torch and does not load against the CPU torch of the
# engine environment, so where it is not installed SGLang's own stand-in takes its place, as SGLang
# stubs missing GPU libraries (the same as tests/engine_env/sglang/conftest.py). Rendering touches no image.
if importlib.util.find_spec("torchvision") is None:
    from sglang._platform_stubs import _MockModule

    for _name in ("torchvision", "torchvision.io", "torchvision.transforms", "torchvision.transforms.functional",
                  "torchvision.transforms.v2"):
        sys.modules.setdefault(_name, _MockModule(_name))

import jinja2
import pydantic
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.parser.template_manager import TemplateManager
from sglang.srt.runtime_context import RuntimeContext, create_context, get_model, get_serving, use_context
from sglang.srt.server_args import ServerArgs

from services.common.errors import InvalidRequest
from services.preprocessor.core import messages as msgs
from services.preprocessor.core import prompt as core
from services.preprocessor.core.artifacts import ArtifactError, ModelArtifacts
from services.preprocessor.core.templates import CANNOT_RENDER, prompt_opens_reasoning

log = logging.getLogger(__name__)
# The model name SGLang's request needs; its conversion reads it only for LoRA (the gateway resolved the model).
_REQUEST_MODEL = "meshfront"
# Content parts SGLang would fetch and process itself (the gateway's media parts).
_MEDIA_PARTS = frozenset({"image_url", "input_audio", "video_url", "audio_url", "image", "audio", "video"})
# runtime_context.use_context swaps process globals and "does not isolate concurrent threads": every
# use of a context holds this (renders run on the preprocessor's worker threads too).
_CONTEXT_LOCK = threading.Lock()


class _TokenizerHalf(TokenizerManager):
    """SGLang's ``TokenizerManager`` with only its model config and tokenizer: the constructor's other
    steps (the scheduler's sockets, watchdogs, LoRA and disaggregation state) serve generation, not
    rendering. Built inside its model's runtime context."""

    def __init__(self, server_args: ServerArgs) -> None:  # super().__init__ is what is left out
        self.server_args = server_args
        self.init_model_config()
        self.init_tokenizer_and_processor()


class _ModelServing:
    """One model directory's SGLang context, tokenizer half and chat handler."""

    def __init__(self, model_dir: str, template_file: str | None) -> None:
        server_args = ServerArgs(model_path=model_dir, chat_template=template_file, device="cpu")
        self.context: RuntimeContext = create_context(server_args, role="tokenizer")
        with self.entered():
            self.tokenizer_manager = _TokenizerHalf(server_args)
            self.template_manager = TemplateManager()
            # As sglang.srt.entrypoints.engine.init_tokenizer_manager initializes it.
            self.template_manager.initialize_templates(
                tokenizer_manager=self.tokenizer_manager, model_path=get_model().model_path,
                chat_template=get_serving().chat_template, completion_template=get_serving().completion_template)
            self.chat = OpenAIServingChat(self.tokenizer_manager, self.template_manager)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        with _CONTEXT_LOCK, use_context(self.context):
            yield


class SglangChatRenderer:
    """One SGLang chat handler per model directory (and deployment template), built on first use (seconds)."""

    name = "sglang"

    def __init__(self) -> None:
        self._servings: dict[tuple[str, str], _ModelServing] = {}
        self._build_lock = threading.Lock()
        self._template_files: dict[str, str] = {}

    def warm(self, artifacts: ModelArtifacts) -> None:
        self._serving(artifacts.model_dir, "")

    def prepare_chat(self, artifacts: ModelArtifacts, chat: core.ChatInput, context_length: int = 0,
                     max_tokens: int | None = None) -> core.PreparedPrompt:
        serving = self._serving(artifacts.model_dir, chat.template_override)
        request = _chat_request(chat)
        # The context check is ours (prompt.check_context, after this), with the same message for every
        # renderer: no max_tokens reaches SGLang's request, so its own check never refuses.
        with serving.entered():
            refused = serving.chat._validate_request(request)
            if refused:
                # What it can refuse here: empty messages, or the tools and tool_choice.
                raise InvalidRequest(refused, param="messages" if refused.startswith("Messages") else "tools")
            try:
                adapted, _ = serving.chat._convert_to_internal_request(request)
            except ValueError as e:  # SGLang's 400s: template errors, kwargs and shapes it refuses
                log.info("SGLang's chat handler refused a request's messages: %r", e)
                raise _refusal(e) from e
            tokenizer = serving.tokenizer_manager.tokenizer
            if adapted.input_ids is not None:
                ids = list(adapted.input_ids)
            else:  # a vision model's prompt goes to SGLang's processor as text (no media reach here)
                ids = list(tokenizer.encode(adapted.text, add_special_tokens=False))
        text = tokenizer.decode(ids, skip_special_tokens=False)
        return core.PreparedPrompt(ids, prompt_opens_reasoning(text), text)

    def _serving(self, model_dir: str, template: str) -> _ModelServing:
        key = (model_dir, template)
        found = self._servings.get(key)
        if found is not None:
            return found
        with self._build_lock:
            found = self._servings.get(key)
            if found is None:
                try:
                    found = _ModelServing(model_dir, self._template_file(template) if template else None)
                except (ValueError, RuntimeError, OSError) as e:  # SGLang's words for what it cannot read
                    raise ArtifactError(f"SGLang cannot build a chat handler for {model_dir}: {e}") from e
                log.info("SGLang's chat handler renders chats of %s (template content format %s)", model_dir,
                         found.template_manager.jinja_template_content_format)
                self._servings[key] = found
            return found

    def _template_file(self, source: str) -> str:
        """The deployment's --chat-template as the file SGLang's --chat-template reads (it takes paths)."""
        path = self._template_files.get(source)
        if path is None:
            with tempfile.NamedTemporaryFile("w", suffix=".jinja", prefix="meshfront-template-", delete=False) as f:
                f.write(source)
            path = self._template_files[source] = f.name
        return path


def _refusal(e: ValueError) -> InvalidRequest:
    """SGLang's reason, as ours words a template's failure: it wraps the template's exceptions in a
    ValueError, whose text for an undefined name or a type error names Python types ('dict object')."""
    cause = e.__cause__
    if type(cause) is jinja2.TemplateError:  # raise_exception(): the template author's words, for the client
        return InvalidRequest(f"chat template error: {cause}", param="messages")
    if isinstance(cause, (jinja2.TemplateError, TypeError)):
        return InvalidRequest(CANNOT_RENDER, param="messages")
    return InvalidRequest(f"the chat cannot be rendered: {e}", param="messages")


def _chat_request(chat: core.ChatInput) -> ChatCompletionRequest:
    """The chat as SGLang's endpoint reads it (its validation, its defaults)."""
    body: dict[str, Any] = {"model": _REQUEST_MODEL,
                            "messages": msgs.parse_json(chat.messages_json, "messages", "messages")}
    if chat.tools_json:
        body["tools"] = msgs.parse_json(chat.tools_json, "tools", "tools")
        if chat.tool_choice_none and chat.hide_tools_for_choice_none:
            body["tool_choice"] = "none"
        elif chat.tool_choice_name:
            body["tool_choice"] = {"type": "function", "function": {"name": chat.tool_choice_name}}
    if chat.chat_template_kwargs_json:
        kwargs = msgs.parse_json(chat.chat_template_kwargs_json, "chat_template_kwargs", "chat_template_kwargs")
        if isinstance(kwargs, dict) and "chat_template" in kwargs:
            # SGLang refuses it naming a server flag we do not have; ours refuses it too.
            raise InvalidRequest("chat_template_kwargs may not set chat_template", param="chat_template_kwargs")
        body["chat_template_kwargs"] = kwargs
    if any(isinstance(m, dict) and isinstance(m.get("content"), list)
           and any(isinstance(p, dict) and p.get("type") in _MEDIA_PARTS for p in m["content"])
           for m in body["messages"]):
        raise InvalidRequest("this deployment renders chats with SGLang's renderer (--chat-processor sglang), which "
                             "does not take image, audio or video content yet", param="messages",
                             code="unsupported_modality")
    try:
        return ChatCompletionRequest.model_validate(body)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        # The location without the union members' class names (ChatCompletionMessage...Param, and SGLang's
        # validator-wrapped "function-after[...]"): no Python name reaches a client.
        where = ".".join(str(x) for x in first["loc"] if not (isinstance(x, str) and (x[:1].isupper() or "[" in x)))
        param = next((x for x in first["loc"] if x in body), "messages")
        raise InvalidRequest(f"{where}: {first['msg']}" if where else first["msg"], param=str(param)) from e


CHAT_RENDERER_CLASS = SglangChatRenderer
