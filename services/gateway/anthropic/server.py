"""gRPC glue for the Anthropic Messages API: HttpBody in, Anthropic JSON or SSE out.

The front door (services/gateway/front_door.py) runs the request's lifecycle in Anthropic's error
shape (``ANTHROPIC``): statuses and bodies before the first byte, Anthropic's in-band ``error``
event after it, a bug as a 500 ``api_error``.
"""

from __future__ import annotations

import uuid

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import anthropic_pb2_grpc

from services.common.errors import MeshError
from services.gateway.anthropic import errors
from services.gateway.anthropic.render import MessageRenderer
from services.gateway.anthropic.request import parse_count_tokens, parse_messages
from services.gateway.core.pipeline import Pipeline
from services.gateway.core.to_proto import chat_to_preprocess, postprocess_options
from services.gateway.front_door import (
    JSON,
    ErrorShape,
    Generation,
    Models,
    check_model,
    generation_rpc,
    headers,
    unexpected,
)

# /v1/messages' abort: Anthropic's status and body for Envoy; 529 tells the SDK to retry.
ANTHROPIC = ErrorShape(body=errors.error_body, status=errors.http_status,
                       retry_after=lambda err: errors.http_status(err) == errors.OVERLOADED_STATUS)


class AnthropicServicer(anthropic_pb2_grpc.AnthropicServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Models):
        self._pipeline = pipeline
        self._models = models

    async def CountTokens(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext):
        """The prompt's real token count: the preprocessor renders and tokenizes it as for generation."""
        rid = uuid.uuid4().hex
        try:
            # x-api-key and anthropic-version arrive with the headers too; as in Dynamo, neither is checked.
            req = parse_count_tokens(request.data, headers(context))
            check_model(self._models(), req.model)
            prepared = await self._pipeline.pre.preprocess(chat_to_preprocess(req, rid))
            return httpbody_pb2.HttpBody(content_type=JSON,
                                         data=orjson.dumps({"input_tokens": len(prepared.request.token_ids)}))
        except MeshError as e:
            err: MeshError = e
        except Exception:  # noqa: BLE001 - a bug still gets Anthropic's shape, and is logged
            err = unexpected("count_tokens", rid)
        await ANTHROPIC.abort(context, err)

    async def _start_message(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                             rid: str) -> Generation:
        req = parse_messages(request.data, headers(context))
        check_model(self._models(), req.model)
        renderer = MessageRenderer(message_id=f"msg_{rid}", model=req.model)
        prep = chat_to_preprocess(req, rid)
        stream = self._pipeline.run([prep], 1, req.worker_id, req.route_hints(),
                                    options=postprocess_options(req, prep))
        return Generation(req.model, req.stream, renderer, stream)

    CreateMessage = generation_rpc(_start_message, "messages", ANTHROPIC)
