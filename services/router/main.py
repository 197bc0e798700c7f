"""Wires the router: discovery mirror -> Router -> gRPC server."""

from __future__ import annotations

import sys

from meshfront.router.v1 import router_pb2_grpc
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.router.config import parse_config
from services.router.server import RouterServicer
from services.router.service import Router


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    registry = WorkerRegistry(cfg.nats_url, "router")
    router = Router(registry.workers_for, cfg.router_mode)
    registry.subscribe(router.on_worker_change)
    await registry.start()
    server = GrpcServer("router", cfg.host, cfg.port)
    router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(router), server.server)
    server.on_stopped(registry.close)
    await server.serve_until_signal()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
