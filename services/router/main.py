"""Wires the router: discovery mirror -> Router (services/router/assembly.py) -> gRPC server."""

from __future__ import annotations

import sys

from meshfront.router.v1 import router_pb2_grpc
from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import serve_metrics
from services.router.assembly import build
from services.router.config import parse_config
from services.router.server import RouterServicer


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    registry = WorkerRegistry(cfg.nats_url, "router")
    router = build(cfg, registry)
    serve_metrics(cfg.metrics_port, cfg.host)
    router.start()  # NATS may come up after us
    await registry.start()
    server = GrpcServer("router", cfg.host, cfg.port, tls=mesh_tls.from_config(cfg))
    router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(router.service), server.server)
    server.on_stopped(registry.close)
    server.on_stopped(router.close)
    await server.serve_until_signal()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
