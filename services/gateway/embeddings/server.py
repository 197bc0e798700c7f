"""gRPC glue for POST /v1/embeddings: ``EmbeddingsService.Embeddings`` (HttpBody in, HttpBody out).

Errors abort the call with the gateway's ``abort_http`` trailers, which Envoy's Lua filter turns into
the HTTP status and OpenAI's error body, as on the chat endpoints.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import embeddings_pb2_grpc

from services.common.discovery import WorkerCard
from services.common.errors import InvalidRequest, MeshError, NotFound
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.request import parse_embeddings
from services.gateway.embeddings.response import render
from services.gateway.request_metrics import RequestTracker
from services.gateway.server import JSON, abort_http


def check_embedding_model(models: dict[str, list[WorkerCard]], name: str) -> None:
    """404 for a model nobody serves; 400 naming ``model`` for a model that generates instead."""
    cards = models.get(name)
    if not cards:
        raise NotFound(f"The model `{name}` does not exist.", param="model", code="model_not_found")
    if not cards[0].model.is_embedding:
        raise InvalidRequest(f"The model `{name}` is not an embedding model; use /v1/chat/completions or "
                             "/v1/completions with it", param="model")


class EmbeddingsServicer(embeddings_pb2_grpc.EmbeddingsServiceServicer):
    def __init__(self, pipeline: EmbeddingsPipeline, models: Callable[[], dict[str, list[WorkerCard]]]):
        self._pipeline = pipeline
        self._models = models

    async def Embeddings(self, request: httpbody_pb2.HttpBody,
                         context: grpc.aio.ServicerContext) -> httpbody_pb2.HttpBody:
        track = RequestTracker("embeddings")
        try:
            req = parse_embeddings(request.data)
            check_embedding_model(self._models(), req.model)
            track.start(req.model, False)
            resp = await self._pipeline.run(req, uuid.uuid4().hex)
            body = render(req.model, resp, req.encoding_format)
            track.finish(resp.prompt_tokens, 0, 0)
            return httpbody_pb2.HttpBody(content_type=JSON, data=body)
        except MeshError as e:
            track.fail(e)
            await abort_http(context, e)
        finally:
            track.close()
        raise AssertionError("unreachable: abort raises")
