"""gRPC glue shared by every worker kind: the WorkerService servicer and the serve/register lifecycle.

``serve_worker`` runs one engine behind a ``GrpcServer``: it starts the engine, registers a
``WorkerCard`` in NATS discovery (unless ``--no-register``), serves until SIGTERM/SIGINT, and on
the way down deregisters first (a drain hook, so routers stop sending new work while in-flight
streams finish), then stops the server and closes the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from meshfront.worker.v1 import worker_pb2, worker_pb2_grpc

from services.common import tls as mesh_tls
from services.common.discovery import ModelCard, Registrar, WorkerCard
from services.common.errors import relay
from services.common.grpc_server import GrpcServer
from services.common.metrics import serve_metrics, worker_metrics
from services.common.mux_session import MuxSession, MuxSessions
from services.workers.config import WorkerConfig
from services.workers.engine import Engine
from services.workers.service import WorkerService

log = logging.getLogger(__name__)


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, service: WorkerService):
        self._service = service
        self.sessions = MuxSessions()

    async def Generate(self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        # A caller's cancel closes the generator, which aborts the sequence and frees its KV blocks.
        await relay(self._service.generate(request), context)

    async def GenerateStream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        # Like Generate, this task owns the stream: when the caller goes away grpc.aio cancels it,
        # and MuxSession aborts every sequence still running on the stream.
        session = MuxSession(self._service.generate, context.write, worker_pb2.GenerateStreamResponse,
                             "worker.GenerateStream")
        await self.sessions.serve(session, request_iterator)


def worker_card(cfg: WorkerConfig, address: str, *, total_kv_blocks: int = 0,
                max_num_batched_tokens: int = 0) -> WorkerCard:
    model = ModelCard(name=cfg.model_name, model_dir=cfg.model_dir, context_length=cfg.context_length,
                      block_size=cfg.block_size, tool_call_parser=cfg.tool_call_parser,
                      reasoning_parser=cfg.reasoning_parser, input_modalities=cfg.input_modalities)
    return WorkerCard(worker_id=cfg.worker_id, address=address, model=model, kind=cfg.kind,
                      total_kv_blocks=total_kv_blocks, max_num_batched_tokens=max_num_batched_tokens)


def build_server(cfg: WorkerConfig, engine: Engine) -> GrpcServer:
    """A bound (not yet started) server exposing ``engine`` as WorkerService."""
    server = GrpcServer(f"worker-{cfg.kind}", cfg.host, cfg.port, tls=mesh_tls.from_config(cfg))
    servicer = WorkerServicer(WorkerService(engine, cfg.input_modalities))
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server.server)
    server.on_drain(servicer.sessions.drain)  # multiplexed streams end when their running sequences have
    return server


class EngineDied(RuntimeError):
    """The engine's own process died; the worker deregistered and stopped (exit status 1)."""


async def serve_worker(cfg: WorkerConfig, engine: Engine, *, total_kv_blocks: int = 0,
                       max_num_batched_tokens: int = 0,
                       engine_failed: Callable[[], Awaitable[BaseException]] | None = None,
                       started: bool = False) -> None:
    """Serves ``engine`` until a signal, registered in discovery for as long as it serves.

    ``engine_failed`` (a real engine's death watch) returns when the engine can serve no more:
    the worker then leaves discovery at once, stops, and raises ``EngineDied``. ``started``: the
    caller already started the engine (it needed the engine's real sizes for ``cfg``).
    """
    if not started:
        await engine.start()  # load a model before the port opens, so "port open" means "ready"
    serve_metrics(cfg.metrics_port, cfg.host)
    worker_metrics()  # every documented name from the first scrape, not the first request
    server = build_server(cfg, engine)
    registrar: Registrar | None = None
    if cfg.register:
        card = worker_card(cfg, cfg.advertised_address(server.port), total_kv_blocks=total_kv_blocks,
                           max_num_batched_tokens=max_num_batched_tokens)
        registrar = Registrar(cfg.nats_url, card)
        server.on_drain(registrar.close)
        # The card goes out after a NATS round trip, by which time serve_until_signal has started
        # the (already bound) server.
        await registrar.start()
        log.info("registering %s for model %s at %s", card.worker_id, card.model.name, card.address)
    death: BaseException | None = None

    async def watch(failed: Callable[[], Awaitable[BaseException]]) -> None:
        nonlocal death
        death = await failed()
        log.error("the engine died (%s); leaving discovery and stopping", death)
        if registrar is not None:
            await registrar.close()  # before anything else: routers must stop picking this worker
        server.request_stop()

    watcher = asyncio.create_task(watch(engine_failed), name="engine-death-watch") if engine_failed else None
    try:
        await server.serve_until_signal()
    finally:
        if watcher is not None:
            watcher.cancel()
        if registrar is not None:
            await registrar.close()
        await engine.close()
    if death is not None:
        raise EngineDied(str(death)) from death
