"""gRPC glue for the gateway: HttpBody in, OpenAI bytes out, statuses at the edge.

Errors before the first byte abort the call with a gRPC status plus two
trailers that Envoy's Lua filter turns into the HTTP status and body
(``x-meshfront-status``, ``x-meshfront-body``); native gRPC callers get the
status with ErrorInfo details. Errors after the first byte become an SSE
error frame, because the HTTP status is already sent.
"""

from __future__ import annotations

import functools
import json
import logging
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable

import grpc
import orjson
from google.api import httpbody_pb2

from meshfront.gateway.v1 import gateway_pb2_grpc
from services.common.discovery import WorkerCard
from services.common.errors import InvalidRequest, MeshError, NotFound, Overloaded, to_status
from services.gateway import models_api
from services.gateway.anthropic import models as anthropic_models
from services.gateway.openai.errors import error_body, sse_error_frame
from services.gateway.openai.extensions import ResponseExtensions
from services.gateway.openai.requests import GenerationRequest, parse_chat, parse_completion
from services.gateway.openai.responses import ResponseRenderer
from services.gateway.openai.to_proto import chat_to_preprocess, completion_to_preprocess
from services.gateway.pipeline import Pipeline
from services.gateway.request_metrics import RequestTracker
from services.gateway.trace import RequestTrace, RouteHints

log = logging.getLogger(__name__)
JSON = "application/json"
SSE = "text/event-stream"


async def abort_http(context: grpc.aio.ServicerContext, err: MeshError) -> None:
    code, message, trailers = to_status(err)
    extra = [("x-meshfront-status", str(err.http_status)), ("x-meshfront-body", error_body(err).decode())]
    if isinstance(err, Overloaded):
        extra.append(("x-meshfront-retry-after", "1"))
    await context.abort(code, message, trailing_metadata=trailers + tuple(extra))


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


async def _send_headers(context: grpc.aio.ServicerContext, ext: ResponseExtensions) -> None:
    """Response headers the request's extensions add (Envoy passes them on); sent with the first bytes."""
    headers = ext.headers()
    if headers:
        await context.send_initial_metadata(headers)


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Callable[[], dict[str, list[WorkerCard]]],
                 draining: Callable[[], bool] = lambda: False, warming: Callable[[], list[str]] = lambda: []):
        self._pipeline = pipeline
        self._models = models
        self._draining = draining
        self._warming = warming  # models of the first discovery view still warming up (not ready yet)

    def _check_model(self, name: str) -> None:
        cards = self._models().get(name)
        if not cards:
            raise NotFound(f"The model `{name}` does not exist.", param="model", code="model_not_found")
        if cards[0].model.is_embedding:
            raise InvalidRequest(f"The model `{name}` is an embedding model; use /v1/embeddings with it",
                                 param="model")

    async def _generate(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, *, chat: bool):
        """POST /v1/chat/completions and /v1/completions (the two RPCs below are this with ``chat`` set:
        one generator per call rather than a wrapper re-yielding every message of the stream)."""
        track = RequestTracker("chat" if chat else "completions")
        try:
            rid = uuid.uuid4().hex
            trace = RequestTrace()
            try:
                headers = _headers(context)
                req: GenerationRequest
                if chat:
                    req = chat_req = parse_chat(request.data, headers)
                    self._check_model(req.model)
                    prep = [chat_to_preprocess(chat_req, rid)]
                    echo = None
                else:
                    req = completion = parse_completion(request.data, headers)
                    self._check_model(req.model)
                    prep = [completion_to_preprocess(completion, p, rid) for p in completion.prompts]
                    # parse_completion refuses echo for token-id prompts, so these are all strings
                    echo = [p for p in completion.prompts if isinstance(p, str)] if completion.echo else None
                ext = ResponseExtensions(req.nvext, trace, rid)
                renderer = ResponseRenderer(chat=chat, request_id=f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
                                            model=req.model, n_choices=len(prep) * req.n,
                                            want_logprobs=req.sampling.logprobs is not None,
                                            include_usage=req.include_usage, echo_prompts=echo, n_per_prompt=req.n,
                                            nvext=ext)
                track.start(req.model, req.stream)
                hints = RouteHints(req.session_id, req.nvext.session_action, req.nvext.session_timeout_s,
                                   req.nvext.priority_jump_s)
                stream = self._pipeline.run(prep, req.n, req.worker_id, hints, trace)
                if not req.stream:
                    async for batch in stream:
                        renderer.fold(batch)
                    track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
                    await _send_headers(context, ext)
                    yield httpbody_pb2.HttpBody(content_type=JSON, data=renderer.body())
                    return
                first = await anext(stream, None)
                await _send_headers(context, ext)
            except MeshError as e:
                track.fail(e)
                await abort_http(context, e)
                return
            # Streaming: headers go out with the first tokens, so early failures above kept a real status.
            try:
                if first is not None:
                    track.first_token()
                    yield httpbody_pb2.HttpBody(content_type=SSE, data=ext.annotation_events() + renderer.sse(first))
                async for batch in stream:
                    data = renderer.sse(batch)
                    if data:
                        yield httpbody_pb2.HttpBody(content_type=SSE, data=data)
                track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
                yield httpbody_pb2.HttpBody(content_type=SSE, data=renderer.sse_end())
            except MeshError as e:
                track.fail(e, mid_stream=True)
                log.warning("request %s failed mid-stream: %s", rid, e.message)
                yield httpbody_pb2.HttpBody(content_type=SSE, data=sse_error_frame(e))
        finally:
            track.close()

    ChatCompletions = functools.partialmethod(_generate, chat=True)
    Completions = functools.partialmethod(_generate, chat=False)

    async def _json(self, context, build: Callable[[], Awaitable[tuple[int, dict]]]):
        status, body = await build()
        if status != 200:
            await context.abort(grpc.StatusCode.UNAVAILABLE if status >= 500 else grpc.StatusCode.NOT_FOUND,
                                body.get("status", "error") if "error" not in body else body["error"]["message"],
                                trailing_metadata=(("x-meshfront-status", str(status)),
                                                   # ASCII: a trailer cannot carry a model id like "café"
                                                   ("x-meshfront-body", json.dumps(body, ensure_ascii=True))))
        return httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(body))

    async def ListModels(self, request, context):
        async def build():
            if anthropic_models.VERSION_HEADER in _headers(context):
                return 200, anthropic_models.list_models(self._models())
            return 200, models_api.list_models(self._models())
        return await self._json(context, build)

    async def GetModel(self, request, context):
        async def build():
            # Clients escape the slash in ids like org/model; the transcoder leaves %2F as is.
            model_id = urllib.parse.unquote(request.model_id)
            if anthropic_models.VERSION_HEADER in _headers(context):
                found = anthropic_models.get_model(self._models(), model_id)
                return (200, found) if found else (404, anthropic_models.not_found(model_id))
            entry = models_api.get_model(self._models(), model_id)
            if entry is None:
                err = NotFound(f"The model `{model_id}` does not exist.", param="model",
                               code="model_not_found")
                return 404, orjson.loads(error_body(err))
            return 200, entry
        return await self._json(context, build)

    async def Health(self, request, context):
        async def build():
            ready, body = models_api.health(self._models(), self._warming())
            return (200 if ready else 503), body
        return await self._json(context, build)

    async def Live(self, request, context):
        async def build():
            if self._draining():
                return 503, {"status": "shutting_down", "message": "Service is draining"}
            return 200, {"status": "live", "message": "Service is live"}
        return await self._json(context, build)
