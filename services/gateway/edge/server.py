"""gRPC glue of EdgeService: /metrics, /openapi.json, /docs and its assets as HttpBody."""

from __future__ import annotations

import grpc
from google.api import httpbody_pb2
from meshfront.gateway.v1 import edge_pb2, edge_pb2_grpc

from services.common.errors import NotFound
from services.gateway.edge import swagger_ui
from services.gateway.edge.replicas import ReplicaMetrics
from services.gateway.front_door import abort_http
from services.gateway.http_api.openapi import document_bytes
from services.gateway.http_api.routes import JSON, PROMETHEUS

# Assets go out in pieces well under Envoy's per-connection buffer (1 MiB) and gRPC's message limit.
CHUNK = 256 * 1024


class EdgeServicer(edge_pb2_grpc.EdgeServiceServicer):
    def __init__(self, metrics: ReplicaMetrics, anthropic_api: bool = True):
        self._metrics = metrics
        self._anthropic_api = anthropic_api  # --enable-anthropic-api: /openapi.json lists /v1/messages

    async def Metrics(self, request: edge_pb2.MetricsRequest, context: grpc.aio.ServicerContext):
        return httpbody_pb2.HttpBody(content_type=PROMETHEUS, data=await self._metrics.gather())

    async def OpenApi(self, request: edge_pb2.OpenApiRequest, context: grpc.aio.ServicerContext):
        return httpbody_pb2.HttpBody(content_type=JSON, data=document_bytes(self._anthropic_api))

    async def Docs(self, request: edge_pb2.DocsRequest, context: grpc.aio.ServicerContext):
        return httpbody_pb2.HttpBody(content_type=swagger_ui.PAGE_TYPE, data=swagger_ui.PAGE)

    async def DocsAsset(self, request: edge_pb2.DocsAssetRequest, context: grpc.aio.ServicerContext):
        found = swagger_ui.asset(request.name)
        if found is None:
            await abort_http(context, NotFound(f"No asset `{request.name}` under /docs/assets/", param="name"))
            return
        content_type, data = found
        for start in range(0, len(data), CHUNK):
            yield httpbody_pb2.HttpBody(content_type=content_type, data=data[start:start + CHUNK])
