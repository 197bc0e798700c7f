"""Wires the all-in-one process: one discovery mirror, every stage in-process, the gateway's gRPC server."""

from __future__ import annotations

import sys

from services.allinone.assembly import build
from services.allinone.config import parse_config
from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import postprocessor_metrics, serve_metrics
from services.postprocessor.core.parsers.backends import ChatProcessorUnavailable


async def serve(argv: list[str]) -> None:
    try:
        cfg = parse_config(argv)
    except ValueError as e:
        raise SystemExit(f"allinone: {e}") from None
    setup_logging(cfg.log_level)
    tls = mesh_tls.from_config(cfg.gateway)
    registry = WorkerRegistry(cfg.nats_url, "allinone")
    try:
        mesh = build(cfg, registry, tls)
    except ChatProcessorUnavailable as e:
        raise SystemExit(f"allinone: {e}") from None
    # One /metrics for the process: the gateway's, the postprocessor's and the router's names.
    serve_metrics(cfg.metrics_port, cfg.host)
    postprocessor_metrics()
    mesh.start()  # NATS may come up after us
    await registry.start()
    server = GrpcServer("gateway", cfg.host, cfg.port, grace_s=cfg.grace_s, tls=tls)
    mesh.gateway.service.add_to(server)
    server.on_stopped(mesh.close)
    server.on_stopped(registry.close)
    await server.serve_until_signal()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
