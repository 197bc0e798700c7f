"""gRPC glue for the Anthropic Messages API: HttpBody in, Anthropic JSON or SSE out.

Same contract as the OpenAI servicer (services/gateway/server.py): errors before the first byte
abort the call with ``x-meshfront-status`` / ``x-meshfront-body`` trailers that Envoy's Lua filter
turns into the HTTP status and body, here Anthropic's status and error shape; once the stream has
begun, a failure is Anthropic's in-band ``error`` event. A bug is answered as a 500 ``api_error``
in the same shape rather than leaking a bare gRPC status.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import anthropic_pb2_grpc

from services.common.discovery import WorkerCard
from services.common.errors import Internal, MeshError, NotFound, to_status
from services.gateway.anthropic import errors
from services.gateway.anthropic.requests import parse_count_tokens, parse_messages
from services.gateway.anthropic.responses import MessageRenderer
from services.gateway.openai.to_proto import chat_to_preprocess, postprocess_options
from services.gateway.pipeline import Pipeline
from services.gateway.request_metrics import RequestTracker

log = logging.getLogger(__name__)
JSON = "application/json"
SSE = "text/event-stream"


async def abort_anthropic(context: grpc.aio.ServicerContext, err: MeshError) -> None:
    code, message, trailers = to_status(err)
    status = errors.http_status(err)
    extra = [("x-meshfront-status", str(status)), ("x-meshfront-body", errors.error_body(err).decode())]
    if status == errors.OVERLOADED_STATUS:
        extra.append(("x-meshfront-retry-after", "1"))
    await context.abort(code, message, trailing_metadata=trailers + tuple(extra))


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    # x-api-key and anthropic-version arrive here too; as in Dynamo, neither is checked.
    return {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


def _unexpected(what: str, rid: str) -> Internal:
    log.exception("%s failed on request %s", what, rid)
    return Internal("internal error in the gateway")


class AnthropicServicer(anthropic_pb2_grpc.AnthropicServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Callable[[], dict[str, list[WorkerCard]]]):
        self._pipeline = pipeline
        self._models = models

    def _check_model(self, name: str) -> None:
        if name not in self._models():
            raise NotFound(f"model: the model `{name}` does not exist", param="model", code="model_not_found")

    async def CountTokens(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext):
        """The prompt's real token count: the preprocessor renders and tokenizes it as for generation."""
        rid = uuid.uuid4().hex
        try:
            req = parse_count_tokens(request.data, _headers(context))
            self._check_model(req.model)
            prepared = await self._pipeline.pre.preprocess(chat_to_preprocess(req, rid))
            return httpbody_pb2.HttpBody(content_type=JSON,
                                         data=orjson.dumps({"input_tokens": len(prepared.request.token_ids)}))
        except MeshError as e:
            err: MeshError = e
        except Exception:  # noqa: BLE001 - a bug still gets Anthropic's shape, and is logged
            err = _unexpected("count_tokens", rid)
        await abort_anthropic(context, err)

    async def CreateMessage(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext):
        track = RequestTracker("messages")
        try:
            async for body in self._generate(request, context, track):
                yield body
        finally:
            track.close()

    async def _generate(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                        track: RequestTracker) -> AsyncIterator[httpbody_pb2.HttpBody]:
        rid = uuid.uuid4().hex
        err: MeshError | None = None
        try:
            req = parse_messages(request.data, _headers(context))
            self._check_model(req.model)
            renderer = MessageRenderer(message_id=f"msg_{rid}", model=req.model)
            track.start(req.model, req.stream)
            prep = chat_to_preprocess(req, rid)
            stream = self._pipeline.run([prep], 1, req.worker_id, options=postprocess_options(req, prep))
            if not req.stream:
                async for batch in stream:
                    renderer.fold(batch)
                body = renderer.body()
            else:
                first = await anext(stream, None)
        except MeshError as e:
            err = e
        except Exception:  # noqa: BLE001 - a bug still gets Anthropic's shape, and is logged
            err = _unexpected("messages", rid)
        if err is not None:
            track.fail(err)
            await abort_anthropic(context, err)
            return
        if not req.stream:
            track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
            yield httpbody_pb2.HttpBody(content_type=JSON, data=body)
            return
        # Streaming: headers go out with the first tokens, so early failures above kept a real status.
        try:
            if first is not None:
                track.first_token()
                yield httpbody_pb2.HttpBody(content_type=SSE, data=renderer.sse(first))
            async for batch in stream:
                data = renderer.sse(batch)
                if data:
                    yield httpbody_pb2.HttpBody(content_type=SSE, data=data)
            track.finish(renderer.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)
            yield httpbody_pb2.HttpBody(content_type=SSE, data=renderer.sse_end())
            return
        except MeshError as e:
            err = e
        except Exception:  # noqa: BLE001 - reported in-band like any other failure
            err = _unexpected("messages stream", rid)
        track.fail(err, mid_stream=True)
        log.warning("request %s failed mid-stream: %s", rid, err.message)
        yield httpbody_pb2.HttpBody(content_type=SSE, data=errors.sse_error_event(err))
