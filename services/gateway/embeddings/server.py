"""gRPC glue for POST /v1/embeddings: ``EmbeddingsService.Embeddings`` (HttpBody in, HttpBody out).

A unary call: no stream to frame, so it uses the front door's parts (services/gateway/front_door.py)
directly: the model check (an embedding model), the request's metrics, and OpenAI's error shape.
"""

from __future__ import annotations

import uuid

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import embeddings_pb2_grpc

from services.common.errors import MeshError
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.render import render
from services.gateway.embeddings.request import parse_embeddings
from services.gateway.front_door import JSON, OPENAI, Models, check_model, unexpected
from services.gateway.request_metrics import RequestTracker


class EmbeddingsServicer(embeddings_pb2_grpc.EmbeddingsServiceServicer):
    def __init__(self, pipeline: EmbeddingsPipeline, models: Models):
        self._pipeline = pipeline
        self._models = models

    async def Embeddings(self, request: httpbody_pb2.HttpBody,
                         context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        rid = uuid.uuid4().hex
        with RequestTracker("embeddings") as track:
            try:
                req = parse_embeddings(request.data)
                check_model(self._models(), req.model, embedding=True)
                track.start(req.model, False)
                resp = await self._pipeline.run(req, rid)
                body = render(req.model, resp, req.encoding_format)
                track.finish(resp.prompt_tokens, 0, 0)
                return httpbody_pb2.HttpBody(content_type=JSON, data=body)
            except MeshError as e:
                err: MeshError = e
            except Exception:  # noqa: BLE001 - a bug still gets OpenAI's shape, and is logged
                err = unexpected("embeddings", rid)
            track.fail(err)
            await OPENAI.abort(context, err)
