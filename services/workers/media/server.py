"""gRPC glue for every media worker kind: ``MediaService.GenerateMedia`` over ``service.MediaService``, and
the card that registers the model as an image or video model.

A media worker serves MediaService only (WorkerService's Generate would answer UNIMPLEMENTED; the
gateway never sends a media model a chat request). Its card lists ``("images",)`` or ``("videos",)``
and the engine's ``MediaLimits``, which is how the gateway, and every stage that skips media models,
tell it apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc
from meshfront.worker.v1 import media_pb2, media_pb2_grpc

from services.common.discovery import IMAGES, VIDEOS, MediaLimits, ModelCard, WorkerCard
from services.common.errors import relay
from services.common.grpc_server import GrpcServer
from services.workers import entry
from services.workers.config import WorkerConfig
from services.workers.media.checks import engine_kind
from services.workers.media.config import DEFAULT_JOBS, JobLimits
from services.workers.media.engine import MediaEngine
from services.workers.media.service import MediaService
from services.workers.server import worker_grpc_server


class MediaServicer(media_pb2_grpc.MediaServiceServicer):
    def __init__(self, service: MediaService):
        self._service = service

    async def GenerateMedia(self, request: media_pb2.GenerateMediaRequest,
                            context: grpc.aio.ServicerContext) -> None:
        # The handler task owns the stream: a caller's cancel closes the service's generator at once,
        # which tells the engine's thread to stop (errors: the server's ErrorInterceptor).
        await relay(self._service.generate(request), context)


def media_card(cfg: WorkerConfig, address: str, limits: MediaLimits) -> WorkerCard:
    endpoints = (VIDEOS,) if engine_kind(limits) == "video" else (IMAGES,)
    model = ModelCard(name=cfg.model_name, model_dir=cfg.model_dir, context_length=cfg.context_length,
                      block_size=cfg.block_size, endpoints=endpoints, media=limits)
    return WorkerCard(worker_id=cfg.worker_id, address=address, model=model, kind=cfg.kind, namespace=cfg.scope.name)


def build_server(cfg: WorkerConfig, service: MediaService) -> GrpcServer:
    """A bound (not yet started) server exposing ``service`` as MediaService."""
    server = worker_grpc_server(cfg)
    media_pb2_grpc.add_MediaServiceServicer_to_server(MediaServicer(service), server.server)
    return server


def media_serving(worker: WorkerConfig, engine: MediaEngine, jobs: JobLimits = DEFAULT_JOBS, *,
                  closers: Sequence[Callable[[], Awaitable[None]]] = ()) -> entry.Serving:
    """``entry.Serving`` for a loaded media engine: any media kind's ``build`` returns this."""
    server = build_server(worker, MediaService(engine, jobs))
    card = media_card(worker, worker.advertised_address(server.port), engine.limits)
    return entry.Serving(worker, server, card, closers=list(closers))
