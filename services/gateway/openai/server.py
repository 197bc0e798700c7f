"""gRPC glue of ``GatewayService``: POST /v1/chat/completions and /v1/completions (HttpBody in, OpenAI
JSON or SSE out), and the model list, health and liveness documents.

The request lifecycle (statuses before the first byte, SSE frames after it, metrics) is the front
door's (services/gateway/front_door.py); this module parses, checks the model and starts the pipeline.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import gateway_pb2_grpc

from services.common.errors import NotFound
from services.gateway import auth, models_api
from services.gateway.core.errors import error_body
from services.gateway.core.extension_hooks import ChatHooks, HookLookup, hooked_body, with_post_hook
from services.gateway.core.openai_request import parse_chat, parse_completion
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.request import GenerationRequest
from services.gateway.core.to_proto import chat_to_preprocess, completion_to_preprocess, postprocess_options
from services.gateway.core.trace import RequestTrace
from services.gateway.front_door import (
    JSON,
    OPENAI,
    ErrorShape,
    Generation,
    Models,
    Reply,
    Started,
    check_model,
    generation_rpc,
    headers,
    http_trailers,
    key_checked,
    unary_rpc,
)
from services.gateway.lora_api import LoraAdmin
from services.gateway.openai.dispatch import PLAIN_CHAT, ChatOutput
from services.gateway.openai.extensions import ResponseExtensions
from services.gateway.openai.render import CompletionRenderer

# The models routes' errors for the anthropic SDK (anthropic-version sent): its 401, with x-api-key taken as well.
ANTHROPIC_MODELS = ErrorShape(body=models_api.anthropic_error_body, api=auth.ANTHROPIC_API)


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Models,
                 draining: Callable[[], bool] = lambda: False, warming: Callable[[], list[str]] = lambda: [],
                 unavailable: Callable[[], list[str]] = lambda: [], lora: LoraAdmin | None = None,
                 chat_hooks: HookLookup | None = None,
                 chat: ChatOutput = PLAIN_CHAT):
        self._pipeline = pipeline
        # The chat engine factory's hooks by model (--chat-engine-factory); None: no factory, nothing to look up.
        self._chat_hooks = chat_hooks
        self._chat = chat  # the gateway's switches over chat answers (--reasoning-field-name, dispatch events)
        self._lora = lora  # /v1/load_lora_adapter and /v1/unload_lora_adapter (None: 404 for both)
        self._models = models
        self._draining = draining
        self._warming = warming  # models of the first discovery view still warming up (not ready yet)
        self._unavailable = unavailable  # stages unreachable past --stage-wait-s (stage_watch.py)

    async def _start(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, rid: str, *,
                     chat: bool) -> Generation:
        """POST /v1/chat/completions (``chat``) and /v1/completions: parsed, checked and started."""
        trace = RequestTrace()
        req: GenerationRequest
        echo: dict[str, Any] = {}
        hooks: ChatHooks | None = None
        if chat:
            data = request.data
            if self._chat_hooks is not None:
                data, hooks = await hooked_body(data, self._chat_hooks)
            req = chat_req = parse_chat(data, headers(context))
            check_model(self._models(), req.model)
            prep = [chat_to_preprocess(chat_req, rid)]
        else:
            req = completion = parse_completion(request.data, headers(context))
            check_model(self._models(), req.model)
            prep = [completion_to_preprocess(completion, p, rid) for p in completion.prompts]
            # parse_completion refuses echo for token-id prompts, so these are all strings
            echo = {"n_per_prompt": req.n, "echo_prompts": [p for p in completion.prompts if isinstance(p, str)]
                    if completion.echo else None}
        ext = ResponseExtensions(req.nvext, trace, rid)
        common: dict[str, Any] = dict(request_id=f"{'chatcmpl' if chat else 'cmpl'}-{rid}", model=req.model,
                                      n_choices=len(prep) * req.n, want_logprobs=req.sampling.logprobs is not None,
                                      include_usage=req.include_usage, nvext=ext)
        renderer = self._chat.renderer(req.stream, **common) if chat else CompletionRenderer(**common, **echo)
        stream = self._pipeline.run(prep, req.n, req.worker_id, req.route_hints(), trace,
                                    options=postprocess_options(req, prep[0]))
        return Generation(req.model, req.stream, with_post_hook(renderer, hooks), stream, extras=ext)

    ChatCompletions = generation_rpc(functools.partial(_start, chat=True), "chat")
    Completions = generation_rpc(functools.partial(_start, chat=False), "completions")

    async def _json(self, context, build: Callable[[], Awaitable[tuple[int, dict]]]):
        status, body = await build()
        if status != 200:
            await context.abort(grpc.StatusCode.UNAVAILABLE if status >= 500 else grpc.StatusCode.NOT_FOUND,
                                body.get("status", "error") if "error" not in body else body["error"]["message"],
                                trailing_metadata=http_trailers(status, orjson.dumps(body)))
        return httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(body))

    async def _visible(self, context: grpc.aio.ServicerContext, endpoint: str) -> tuple[bool, dict]:
        """Whether the caller is the anthropic SDK, and the models it may see (with --auth, its key's: a model
        outside them is as unknown as one nobody serves; a missing key is the 401 in the SDK's shape)."""
        anthropic = models_api.ANTHROPIC_VERSION_HEADER in headers(context)
        door = await key_checked(context, endpoint, ANTHROPIC_MODELS if anthropic else OPENAI)
        return anthropic, door.visible(self._models())

    async def ListModels(self, request, context):
        async def build():
            anthropic, models = await self._visible(context, "models list")
            return 200, (models_api.anthropic_list_models if anthropic else models_api.list_models)(models)
        return await self._json(context, build)

    async def GetModel(self, request, context):
        async def build():
            # Clients escape the slash in ids like org/model; the transcoder leaves %2F as is.
            model_id = urllib.parse.unquote(request.model_id)
            anthropic, models = await self._visible(context, "model get")
            if anthropic:
                found = models_api.anthropic_get_model(models, model_id)
                return (200, found) if found else (404, models_api.anthropic_not_found(model_id))
            entry = models_api.get_model(models, model_id)
            if entry is None:
                err = NotFound(f"The model `{model_id}` does not exist.", param="model",
                               code="model_not_found")
                return 404, orjson.loads(error_body(err))
            return 200, entry
        return await self._json(context, build)

    async def _lora_change(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, rid: str,
                           started: Started, *, load: bool) -> Reply:
        """vLLM's answer: a text/plain line; errors in OpenAI's envelope (services/gateway/lora_api.py)."""
        if self._lora is None:
            raise NotFound("LoRA adapters cannot be loaded through this gateway.")
        # ``started`` is the front door's model check (--auth: the key's --models); nothing here is counted.
        text = await (self._lora.load if load else self._lora.unload)(request.data, started)
        return Reply(httpbody_pb2.HttpBody(content_type="text/plain; charset=utf-8", data=text.encode()))

    # Administration, not generation: /metrics does not count it (``counted``), as it never has.
    LoadLoraAdapter = unary_rpc(functools.partial(_lora_change, load=True), "lora load", counted=False)
    UnloadLoraAdapter = unary_rpc(functools.partial(_lora_change, load=False), "lora unload", counted=False)

    async def Health(self, request, context):
        async def build():
            ready, body = models_api.health(self._models(), self._warming(), self._unavailable())
            return (200 if ready else 503), body
        return await self._json(context, build)

    async def Live(self, request, context):
        async def build():
            if self._draining():
                return 503, {"status": "shutting_down", "message": "Service is draining"}
            return 200, {"status": "live", "message": "Service is live"}
        return await self._json(context, build)
