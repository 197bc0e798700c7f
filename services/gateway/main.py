"""Wires the gateway: discovery mirror, the three stage clients, the gRPC server."""

from __future__ import annotations

import sys

from meshfront.gateway.v1 import gateway_pb2_grpc
from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import gateway_metrics, serve_metrics
from services.gateway import clients
from services.gateway.config import INPROC, GatewayConfig, parse_config
from services.gateway.kserve import server as kserve
from services.gateway.pipeline import Pipeline
from services.gateway.server import GatewayServicer


def build_pipeline(cfg: GatewayConfig, registry: WorkerRegistry, server: GrpcServer,
                   tls: mesh_tls.MeshTls | None = None) -> Pipeline:
    if cfg.preprocessor == INPROC:
        from services.preprocessor.service import Preprocessor

        pre = clients.InProcessPreprocessor(Preprocessor(registry.model))
    else:
        pre = clients.GrpcPreprocessor(cfg.preprocessor, tls)
    if cfg.router == INPROC:
        from services.router.service import Router

        router_service = Router(registry.workers_for, cfg.router_mode)
        registry.subscribe(router_service.on_worker_change)
        router = clients.InProcessRouter(router_service)
    else:
        router = clients.GrpcRouter(cfg.router, tls)
    if cfg.postprocessor == INPROC:
        from services.postprocessor.migration import Migrator
        from services.postprocessor.service import Postprocessor
        from services.postprocessor.worker_client import GrpcWorkerClient

        workers = GrpcWorkerClient(tls)
        # In-process: migrate via the gateway's router.
        postprocessor = Postprocessor(workers, migrator=Migrator(router))
        server.on_stopped(postprocessor.close)
        server.on_stopped(workers.close)
        post = clients.InProcessPostprocessor(postprocessor)
    else:
        post = clients.GrpcPostprocessor(cfg.postprocessor, tls)
    return Pipeline(pre, router, post)


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    serve_metrics(cfg.metrics_port, cfg.host)
    gateway_metrics()  # every documented name from the first scrape, not the first request
    registry = WorkerRegistry(cfg.nats_url, "gateway")
    await registry.start()
    tls = mesh_tls.from_config(cfg)
    server = GrpcServer("gateway", cfg.host, cfg.port, tls=tls)
    draining = False

    async def start_drain() -> None:
        nonlocal draining
        draining = True

    server.on_drain(start_drain)
    servicer_pipeline = build_pipeline(cfg, registry, server, tls)
    servicer = GatewayServicer(servicer_pipeline, registry.models, lambda: draining)
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server.server)
    kserve.add_to_server(kserve.KServeServicer(servicer_pipeline, registry.models, lambda: draining), server.server)
    server.on_stopped(registry.close)
    await server.serve_until_signal()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
