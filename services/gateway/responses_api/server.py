"""gRPC glue for the Responses API: HttpBody in, the response object or its event stream out.

POST /v1/responses runs through the front door (services/gateway/front_door.py) like chat: OpenAI's
error body before the first byte, a ``response.failed`` event after it. Its renderer
(render.py ``ResponsesRenderer``) stores a response before the client learns it is done (before the
body, or before ``response.completed``), so a continuation sent right after it finds it on any replica.
"""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import responses_pb2_grpc

from services.common.errors import NotFound
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.to_proto import chat_to_preprocess, postprocess_options
from services.gateway.front_door import (
    JSON,
    Generation,
    Models,
    Reply,
    Started,
    check_model,
    generation_rpc,
    headers,
    unary_rpc,
)
from services.gateway.responses_api.conversation import output_as_input, to_chat
from services.gateway.responses_api.render import ResponseObjectBuilder, ResponsesRenderer, echo_fields
from services.gateway.responses_api.request import ResponsesRequest, parse_responses
from services.gateway.responses_api.store import ResponseStore


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


class ResponsesServicer(responses_pb2_grpc.ResponsesServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Models, store: ResponseStore):
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

    async def _start_response(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                              rid: str) -> Generation:
        req = parse_responses(request.data, headers(context))
        check_model(self._models(), req.model)
        conversation = await self._conversation(req)
        chat = to_chat(req, conversation)
        prep = chat_to_preprocess(chat, rid)

        async def store(builder: ResponseObjectBuilder) -> None:
            if req.store:
                await self._store.put(builder.id, {"response": builder.response(), "input": conversation})

        renderer = ResponsesRenderer(ResponseObjectBuilder(f"resp_{rid}", echo_fields(req)), store)
        stream = self._pipeline.run([prep], 1, chat.worker_id, chat.route_hints(),
                                    options=postprocess_options(chat, prep))
        return Generation(req.model, req.stream, renderer, stream, on_complete=renderer.complete)

    CreateResponse = generation_rpc(_start_response, "responses")

    async def _get(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        record = await self._store.get(request.response_id)
        if record is None:
            raise _not_found(request.response_id)
        return Reply(httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(record["response"])))

    async def _delete(self, request, context: grpc.aio.ServicerContext, request_id: str, started: Started) -> Reply:
        if not await self._store.delete(request.response_id):
            raise _not_found(request.response_id)
        return Reply(httpbody_pb2.HttpBody(content_type=JSON, data=orjson.dumps(
            {"id": request.response_id, "object": "response.deleted", "deleted": True})))

    # Reads of the store, not generations: /metrics does not count them (``counted``), as it never has.
    GetResponse = unary_rpc(_get, "response get", counted=False)
    DeleteResponse = unary_rpc(_delete, "response delete", counted=False)
