"""Builds the gateway from its config: the pipeline over the three stage clients and its servicers
(OpenAI over HttpBody, KServe, and the edge documents: /metrics, /openapi.json, /docs).

Used by the gateway's own process (main.py, gRPC clients from ``--preprocessor/--router/--postprocessor``)
and by the all-in-one process (services/allinone), which hands in in-process clients instead.
"""

from __future__ import annotations

import dataclasses
import socket

from meshfront.gateway.v1 import (
    anthropic_pb2_grpc,
    edge_pb2_grpc,
    embeddings_pb2_grpc,
    gateway_pb2_grpc,
    responses_pb2_grpc,
)

from services.common import tls as mesh_tls
from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer
from services.gateway import clients, frontend_metrics
from services.gateway.anthropic.server import AnthropicServicer
from services.gateway.config import GatewayConfig
from services.gateway.core.pipeline import Pipeline
from services.gateway.edge.replicas import ReplicaMetrics
from services.gateway.edge.server import EdgeServicer
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.server import EmbeddingsServicer
from services.gateway.embeddings.worker_client import GrpcEmbedWorker
from services.gateway.kserve import server as kserve
from services.gateway.openai.server import GatewayServicer
from services.gateway.postprocessor_mux import MuxPostprocessor
from services.gateway.releases import RidingReleases
from services.gateway.responses_api.server import ResponsesServicer
from services.gateway.responses_api.store import ResponseStore
from services.gateway.warmup import Warmup


@dataclasses.dataclass
class Gateway:
    pipeline: Pipeline
    registry: WorkerRegistry
    # Stored /v1/responses responses (NATS JetStream KV, shared by every replica).
    response_store: ResponseStore
    metrics: ReplicaMetrics
    # POST /v1/embeddings: the same preprocessor and router clients, then the embedding worker directly.
    embeddings: EmbeddingsPipeline
    draining: bool = False

    def __post_init__(self) -> None:
        self.warmup = Warmup(self.pipeline, self.registry)
        self.servicer = GatewayServicer(self.pipeline, self.registry.models, lambda: self.draining,
                                        warming=lambda: self.warmup.warming if not self.warmup.ready.is_set() else [])
        self.kserve = kserve.KServeServicer(self.pipeline, self.registry.models, lambda: self.draining)
        self.responses = ResponsesServicer(self.pipeline, self.registry.models, self.response_store)
        self.anthropic = AnthropicServicer(self.pipeline, self.registry.models)
        self.edge = EdgeServicer(self.metrics)
        self.embeddings_servicer = EmbeddingsServicer(self.embeddings, self.registry.models)

    async def start_drain(self) -> None:
        self.draining = True

    def add_to(self, server: GrpcServer) -> None:
        """Serves the OpenAI (HttpBody: chat and completions, Responses), Anthropic (HttpBody), edge
        (/metrics, /openapi.json, /docs) and KServe services on ``server``; draining starts with its drain."""
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(self.servicer, server.server)
        responses_pb2_grpc.add_ResponsesServiceServicer_to_server(self.responses, server.server)
        anthropic_pb2_grpc.add_AnthropicServiceServicer_to_server(self.anthropic, server.server)
        edge_pb2_grpc.add_EdgeServiceServicer_to_server(self.edge, server.server)
        embeddings_pb2_grpc.add_EmbeddingsServiceServicer_to_server(self.embeddings_servicer, server.server)
        kserve.add_to_server(self.kserve, server.server)
        server.on_drain(self.start_drain)
        server.ready_when(self.warmup.ready.wait)


def build(cfg: GatewayConfig, registry: WorkerRegistry, tls: mesh_tls.MeshTls | None = None, *,
          preprocessor: clients.PreprocessorClient | None = None, router: clients.RouterClient | None = None,
          postprocessor: clients.PostprocessorClient | None = None) -> Built[Gateway]:
    """The gateway; a stage client not handed in is a gRPC client of the stage's configured target.

    The response store connects to ``cfg.nats_url`` in the background (``start``), in both shapes.
    Embedding workers are always reached over gRPC (they are their own processes in both shapes).
    """
    pre = preprocessor or clients.GrpcPreprocessor(cfg.preprocessor, tls)
    route = RidingReleases(router or clients.GrpcRouter(cfg.router, tls))
    closers = []
    if postprocessor is not None:
        post = postprocessor
    elif cfg.postprocessor_transport == "mux":
        post = mux_post = MuxPostprocessor(cfg.postprocessor, tls)
        closers.append(mux_post.close)
    else:
        post = clients.GrpcPostprocessor(cfg.postprocessor, tls)
    store = ResponseStore(cfg.nats_url, cfg.responses_ttl_s)
    # Every request family exists from the first scrape; /metrics at the edge gathers all replicas'.
    recorder = frontend_metrics.configure(cfg.metrics_prefix)
    metrics = ReplicaMetrics(cfg.nats_url, f"{socket.gethostname()}:{cfg.port}", recorder.registry)
    embed_workers = GrpcEmbedWorker(tls)
    gateway = Gateway(Pipeline(pre, route, post, cfg.stream_interval), registry, response_store=store,
                      metrics=metrics, embeddings=EmbeddingsPipeline(pre, route, embed_workers))
    return Built(gateway, background=[store.run, metrics.run, gateway.warmup.run],
                 closers=[gateway.warmup.close, route.close, store.close, metrics.close, embed_workers.close,
                          *closers])
