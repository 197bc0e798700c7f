"""gRPC glue for the Anthropic Messages API: HttpBody in, Anthropic JSON or SSE out.

The front door (services/gateway/front_door.py) runs the request's lifecycle in Anthropic's error
shape (``ANTHROPIC``): statuses and bodies before the first byte, Anthropic's in-band ``error``
event after it, a bug as a 500 ``api_error``. ``CountTokens`` is the front door's unary shape.
"""

from __future__ import annotations

import grpc
import orjson
from google.api import httpbody_pb2
from meshfront.gateway.v1 import anthropic_pb2_grpc

from services.common.errors import NotFound
from services.gateway import auth
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
    Reply,
    Started,
    check_model,
    generation_rpc,
    headers,
    unary_rpc,
)

# /v1/messages' abort: Anthropic's status and body for Envoy; 529 tells the SDK to retry.
ANTHROPIC = ErrorShape(body=errors.error_body, status=errors.http_status,
                       retry_after=lambda err: errors.http_status(err) == errors.OVERLOADED_STATUS,
                       api=auth.ANTHROPIC_API)  # x-api-key or Bearer; anthropic-ratelimit-* headers (--auth)


# What both routes answer while the API is off (--no-enable-anthropic-api): a 404, as a route never served is.
API_OFF = ("The Anthropic Messages API is off on this gateway; start it with --enable-anthropic-api "
           "(env DYN_ENABLE_ANTHROPIC_API=true)")


class AnthropicServicer(anthropic_pb2_grpc.AnthropicServiceServicer):
    def __init__(self, pipeline: Pipeline, models: Models, *, enabled: bool = True, strip_preamble: bool = True):
        self._pipeline = pipeline
        self._models = models
        self._strip_preamble = strip_preamble  # --strip-anthropic-preamble
        if not enabled:
            # The RPCs are bound when the servicer is registered: these instance attributes replace the
            # class's, so an API that is on runs exactly as before and one that is off does no work at all.
            self.CreateMessage = self.CountTokens = self._off

    async def _off(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext) -> None:
        """Either route while the API is off: a 404 in Anthropic's shape, not counted in /metrics (no route)."""
        await ANTHROPIC.abort(context, NotFound(API_OFF))

    async def _count_tokens(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, rid: str,
                            started: Started) -> Reply:
        """The prompt's real token count: the preprocessor renders and tokenizes it as for generation."""
        # x-api-key is the front door's to check (--auth); anthropic-version, as in Dynamo, is not checked.
        req = parse_count_tokens(request.data, headers(context), strip_preamble=self._strip_preamble)
        check_model(self._models(), req.model)
        prepared = await self._pipeline.pre.preprocess(chat_to_preprocess(req, rid))
        return Reply(httpbody_pb2.HttpBody(content_type=JSON,
                                           data=orjson.dumps({"input_tokens": len(prepared.request.token_ids)})))

    async def _start_message(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext,
                             rid: str) -> Generation:
        req = parse_messages(request.data, headers(context), strip_preamble=self._strip_preamble)
        check_model(self._models(), req.model)
        renderer = MessageRenderer(message_id=f"msg_{rid}", model=req.model)
        prep = chat_to_preprocess(req, rid)
        stream = self._pipeline.run([prep], 1, req.worker_id, req.route_hints(),
                                    options=postprocess_options(req, prep))
        return Generation(req.model, req.stream, renderer, stream)

    CreateMessage = generation_rpc(_start_message, "messages", ANTHROPIC)
    # Not a generation: /metrics does not count it (``counted``), as it never has.
    CountTokens = unary_rpc(_count_tokens, "count_tokens", ANTHROPIC, counted=False)
