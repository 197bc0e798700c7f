"""gRPC glue for POST /v1/embeddings: ``EmbeddingsService.Embeddings`` (HttpBody in, HttpBody out).

A unary call: the front door's unary shape (services/gateway/front_door.py ``unary_rpc``) runs its
lifecycle: OpenAI's error shape, the request's metrics, a bug as a 500.
"""

from __future__ import annotations

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import embeddings_pb2_grpc

from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.render import render
from services.gateway.embeddings.request import parse_embeddings
from services.gateway.front_door import JSON, Models, Reply, Started, check_model, unary_rpc


class EmbeddingsServicer(embeddings_pb2_grpc.EmbeddingsServiceServicer):
    def __init__(self, pipeline: EmbeddingsPipeline, models: Models):
        self._pipeline = pipeline
        self._models = models

    async def _embed(self, request: httpbody_pb2.HttpBody, context: grpc.aio.ServicerContext, request_id: str,
                     started: Started) -> Reply:
        req = parse_embeddings(request.data)
        check_model(self._models(), req.model, embedding=True)
        started(req.model)
        resp = await self._pipeline.run(req, request_id)
        body = render(req.model, resp, req.encoding_format)
        return Reply(httpbody_pb2.HttpBody(content_type=JSON, data=body), prompt_tokens=resp.prompt_tokens)

    Embeddings = unary_rpc(_embed, "embeddings")
