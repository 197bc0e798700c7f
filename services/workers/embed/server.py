"""gRPC glue for the embedding worker: ``WorkerService.Embed`` over ``EmbedService``, registered in
discovery as an embedding model.

Only ``Embed`` is implemented; ``Generate`` and ``GenerateStream`` answer UNIMPLEMENTED (the
gateway never sends a chat or completions request to a model whose card says ``embeddings``). The
card's ``endpoints`` is ``("embeddings",)``: the field every service already reads, so a card from
this worker is valid to a service that predates it (an unknown field would not be).
"""

from __future__ import annotations

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common.discovery import EMBEDDINGS, ModelCard, WorkerCard
from services.common.grpc_server import GrpcServer
from services.common.model_files import model_files_reference
from services.workers.config import WorkerConfig
from services.workers.embed.service import EmbedService
from services.workers.server import worker_grpc_server


class EmbedServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, service: EmbedService):
        self._service = service

    async def Embed(self, request: worker_pb2.EmbedRequest,
                    context: grpc.aio.ServicerContext) -> worker_pb2.EmbedResponse:
        return await self._service.embed(request)  # errors: the server's ErrorInterceptor


def embedding_card(cfg: WorkerConfig, address: str) -> WorkerCard:
    model = ModelCard(name=cfg.model_name, model_dir=cfg.model_dir, context_length=cfg.context_length,
                      block_size=cfg.block_size, endpoints=(EMBEDDINGS,),
                      model_files=model_files_reference(cfg.scope, cfg.model_dir))
    return WorkerCard(worker_id=cfg.worker_id, address=address, model=model, kind=cfg.kind, namespace=cfg.scope.name)


def build_server(cfg: WorkerConfig, service: EmbedService) -> GrpcServer:
    """A bound (not yet started) server exposing ``service`` as WorkerService.Embed."""
    server = worker_grpc_server(cfg)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(EmbedServicer(service), server.server)
    return server
