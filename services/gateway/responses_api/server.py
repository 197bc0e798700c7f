"""gRPC glue for the Responses API: HttpBody in, the response object or its event stream out.

Errors before the first byte go through the gateway's ``abort_http`` (status and OpenAI error body via
Envoy); a streamed response sends its first bytes with its first tokens, like chat, so routing and
worker-start failures keep a real status. After that a failure is a ``response.failed`` event.
A stored response is written before the client learns it is done (before the body, or before
``response.completed``), so a continuation sent right after it finds it on any replica.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import responses_pb2_grpc

from services.common.discovery import WorkerCard
from services.common.errors import MeshError, NotFound
from services.gateway.openai.to_proto import chat_to_preprocess, postprocess_options
from services.gateway.pipeline import Pipeline
from services.gateway.request_metrics import RequestTracker
from services.gateway.responses_api.conversation import output_as_input, to_chat
from services.gateway.responses_api.render import ResponseBuilder, echo_fields, sse
from services.gateway.responses_api.request import ResponsesRequest, parse_responses
from services.gateway.responses_api.store import ResponseStore
from services.gateway.server import JSON, SSE, abort_http

log = logging.getLogger(__name__)


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


class ResponsesServicer(responses_pb2_grpc.ResponsesServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Callable[[], dict[str, list[WorkerCard]]], store: ResponseStore):
        self._pipeline = pipeline
        self._models = models
        self._store = store

    async def _conversation(self, req: ResponsesRequest) -> list[dict[str, Any]]:
        """Every input item of this turn: the stored chain's (its outputs included), then this request's."""
        if req.previous_response_id is None:
            return req.items
        record = await self._store.get(req.previous_response_id)
        if record is None:
            raise NotFound(f"Previous response with id '{req.previous_response_id}' not found "
                           "(never stored, expired or deleted).", param="previous_response_id",
                           code="previous_response_not_found")
        return [*record["input"], *output_as_input(record["response"]["output"]), *req.items]

    async def _store_response(self, req: ResponsesRequest, builder: ResponseBuilder,
                              conversation: list[dict[str, Any]]) -> None:
        if req.store:
            await self._store.put(builder.id, {"response": builder.response(), "input": conversation})

    async def CreateResponse(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext):
        track = RequestTracker("responses")
        try:
            async for body in self._create(request, context, track):
                yield body
        finally:
            track.close()

    async def _create(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                      track: RequestTracker):
        rid = uuid.uuid4().hex
        try:
            headers = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
            req = parse_responses(request.data, headers)
            if req.model not in self._models():
                raise NotFound(f"The model `{req.model}` does not exist.", param="model", code="model_not_found")
            conversation = await self._conversation(req)
            chat = to_chat(req, conversation)
            prep = chat_to_preprocess(chat, rid)
            builder = ResponseBuilder(f"resp_{rid}", echo_fields(req))
            track.start(req.model, req.stream)
            stream = self._pipeline.run([prep], 1, req.worker_id, options=postprocess_options(chat, prep))
            if not req.stream:
                async for batch in stream:
                    builder.feed(batch)
                builder.finish()
                await self._store_response(req, builder, conversation)
                track.finish(builder.input_tokens, builder.output_tokens, builder.cached_tokens)
                yield httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(builder.response()))
                return
            first = await anext(stream, None)
        except MeshError as e:
            track.fail(e)
            await abort_http(context, e)
            return
        try:
            events = builder.start()
            if first is not None:
                track.first_token()
                events += builder.feed(first)
            yield httpbody_pb2.HttpBody(content_type=SSE, data=sse(events))
            async for batch in stream:
                events = builder.feed(batch)
                if events:
                    yield httpbody_pb2.HttpBody(content_type=SSE, data=sse(events))
            events = builder.finish()
            try:
                await self._store_response(req, builder, conversation)
            except MeshError as e:  # the output went out, but it cannot be continued: say so
                track.fail(e, mid_stream=True)
                log.warning("response %s not stored: %s", builder.id, e.message)
                yield httpbody_pb2.HttpBody(content_type=SSE, data=sse(events + builder.fail(e)))
                return
            track.finish(builder.input_tokens, builder.output_tokens, builder.cached_tokens)
            yield httpbody_pb2.HttpBody(content_type=SSE, data=sse([*events, builder.final_event()]))
        except MeshError as e:
            track.fail(e, mid_stream=True)
            log.warning("response %s failed mid-stream: %s", builder.id, e.message)
            yield httpbody_pb2.HttpBody(content_type=SSE, data=sse(builder.fail(e)))

    async def GetResponse(self, request, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        try:
            record = await self._store.get(request.response_id)
            if record is None:
                raise _not_found(request.response_id)
        except MeshError as e:
            await abort_http(context, e)
            raise AssertionError("abort raises") from None
        return httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(record["response"]))

    async def DeleteResponse(self, request, context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        try:
            if not await self._store.delete(request.response_id):
                raise _not_found(request.response_id)
        except MeshError as e:
            await abort_http(context, e)
            raise AssertionError("abort raises") from None
        return httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(
            {"id": request.response_id, "object": "response.deleted", "deleted": True}))
