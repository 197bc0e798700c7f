"""Builds the gateway from its config: the pipeline over the three stage clients and both servicers.

Used by the gateway's own process (main.py, gRPC clients from ``--preprocessor/--router/--postprocessor``)
and by the all-in-one process (services/allinone), which hands in in-process clients instead.
"""

from __future__ import annotations

import dataclasses

from meshfront.gateway.v1 import embeddings_pb2_grpc, gateway_pb2_grpc

from services.common import tls as mesh_tls
from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer
from services.gateway import clients
from services.gateway.config import GatewayConfig
from services.gateway.embeddings.pipeline import EmbeddingsPipeline
from services.gateway.embeddings.server import EmbeddingsServicer
from services.gateway.embeddings.worker_client import GrpcEmbedWorker
from services.gateway.kserve import server as kserve
from services.gateway.pipeline import Pipeline
from services.gateway.server import GatewayServicer


@dataclasses.dataclass
class Gateway:
    pipeline: Pipeline
    registry: WorkerRegistry
    # POST /v1/embeddings: the same preprocessor and router clients, then the embedding worker directly.
    embeddings: EmbeddingsPipeline
    draining: bool = False

    def __post_init__(self) -> None:
        self.servicer = GatewayServicer(self.pipeline, self.registry.models, lambda: self.draining)
        self.kserve = kserve.KServeServicer(self.pipeline, self.registry.models, lambda: self.draining)
        self.embeddings_servicer = EmbeddingsServicer(self.embeddings, self.registry.models)

    async def start_drain(self) -> None:
        self.draining = True

    def add_to(self, server: GrpcServer) -> None:
        """Serves the OpenAI (HttpBody) and KServe services on ``server``; draining starts with its drain."""
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(self.servicer, server.server)
        embeddings_pb2_grpc.add_EmbeddingsServiceServicer_to_server(self.embeddings_servicer, server.server)
        kserve.add_to_server(self.kserve, server.server)
        server.on_drain(self.start_drain)


def build(cfg: GatewayConfig, registry: WorkerRegistry, tls: mesh_tls.MeshTls | None = None, *,
          preprocessor: clients.PreprocessorClient | None = None, router: clients.RouterClient | None = None,
          postprocessor: clients.PostprocessorClient | None = None) -> Built[Gateway]:
    """The gateway; a stage client not handed in is a gRPC client of the stage's configured target.

    Embedding workers are always reached over gRPC (they are their own processes in both shapes).
    """
    pre = preprocessor or clients.GrpcPreprocessor(cfg.preprocessor, tls)
    route = router or clients.GrpcRouter(cfg.router, tls)
    post = postprocessor or clients.GrpcPostprocessor(cfg.postprocessor, tls)
    embed_workers = GrpcEmbedWorker(tls)
    return Built(Gateway(Pipeline(pre, route, post), registry, EmbeddingsPipeline(pre, route, embed_workers)),
                 closers=[embed_workers.close])
