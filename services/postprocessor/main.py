"""Wires the postprocessor: Postprocessor (services/postprocessor/assembly.py) -> gRPC server."""

from __future__ import annotations

import sys

from meshfront.postprocessor.v1 import postprocessor_pb2_grpc
from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import postprocessor_metrics, serve_metrics
from services.postprocessor.assembly import build
from services.postprocessor.config import parse_config
from services.postprocessor.core.parsers.backends import ChatProcessorUnavailable
from services.postprocessor.server import PostprocessorServicer


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    tls = mesh_tls.from_config(cfg)
    registry = WorkerRegistry(cfg.nats_url, "postprocessor")
    try:
        postprocessor = build(cfg, registry, tls)
    except ChatProcessorUnavailable as e:
        raise SystemExit(f"postprocessor: {e}") from None
    await registry.start()
    serve_metrics(cfg.metrics_port, cfg.host)
    postprocessor_metrics()  # every documented name from the first scrape, not the first request
    server = GrpcServer("postprocessor", cfg.host, cfg.port, grace_s=cfg.drain_grace_s, tls=tls)
    servicer = PostprocessorServicer(postprocessor.service)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(servicer, server.server)
    server.on_drain(servicer.sessions.drain)  # multiplexed streams end when their running requests have
    postprocessor.start()
    try:
        await server.serve_until_signal()
    finally:
        await postprocessor.close()
        await registry.close()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
