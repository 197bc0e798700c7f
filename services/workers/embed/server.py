"""gRPC glue for the embedding worker: ``WorkerService.Embed`` over ``EmbedService``, registered in
discovery as an embedding model.

Only ``Embed`` is implemented; ``Generate`` and ``GenerateStream`` answer UNIMPLEMENTED (the
gateway never sends a chat or completions request to a model whose card says ``embeddings``). The
card's ``endpoints`` is ``("embeddings",)``: the field every service already reads, so a card from
this worker is valid to a service that predates it (an unknown field would not be).
"""

from __future__ import annotations

import logging

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.discovery import EMBEDDINGS, ModelCard, Registrar, WorkerCard
from services.common.grpc_server import GrpcServer
from services.common.metrics import embed_metrics, serve_metrics, worker_metrics
from services.workers.config import WorkerConfig
from services.workers.embed.service import EmbedService

log = logging.getLogger(__name__)


class EmbedServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, service: EmbedService):
        self._service = service

    async def Embed(self, request: worker_pb2.EmbedRequest,
                    context: grpc.aio.ServicerContext) -> worker_pb2.EmbedResponse:
        return await self._service.embed(request)  # errors: the server's ErrorInterceptor


def embedding_card(cfg: WorkerConfig, address: str) -> WorkerCard:
    model = ModelCard(name=cfg.model_name, model_dir=cfg.model_dir, context_length=cfg.context_length,
                      block_size=cfg.block_size, endpoints=(EMBEDDINGS,))
    return WorkerCard(worker_id=cfg.worker_id, address=address, model=model, kind=cfg.kind)


def build_server(cfg: WorkerConfig, service: EmbedService) -> GrpcServer:
    """A bound (not yet started) server exposing ``service`` as WorkerService.Embed."""
    server = GrpcServer(f"worker-{cfg.kind}", cfg.host, cfg.port, tls=mesh_tls.from_config(cfg))
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(EmbedServicer(service), server.server)
    return server


async def serve_embedder(cfg: WorkerConfig, service: EmbedService) -> None:
    """Serves until a signal, registered in discovery for as long as it serves (the model is loaded)."""
    serve_metrics(cfg.metrics_port, cfg.host)
    worker_metrics()
    embed_metrics()  # every documented name from the first scrape
    server = build_server(cfg, service)
    registrar: Registrar | None = None
    if cfg.register:
        card = embedding_card(cfg, cfg.advertised_address(server.port))
        registrar = Registrar(cfg.nats_url, card)
        server.on_drain(registrar.close)
        await registrar.start()
        log.info("registering %s for embedding model %s at %s", card.worker_id, card.model.name, card.address)
    service.batcher.start()
    try:
        await server.serve_until_signal()
    finally:
        if registrar is not None:
            await registrar.close()
        await service.batcher.close()
