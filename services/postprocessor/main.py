"""Wires the postprocessor: Postprocessor (with its worker channel pool) -> gRPC server."""

from __future__ import annotations

import sys

from meshfront.postprocessor.v1 import postprocessor_pb2_grpc
from services.common import tls as mesh_tls
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import postprocessor_metrics, serve_metrics
from services.postprocessor.config import parse_config
from services.postprocessor.core.parsers.backends import ChatProcessorUnavailable, load_chat_processor
from services.postprocessor.migration import Migrator
from services.postprocessor.mux_client import MuxWorkerClient
from services.postprocessor.router_client import GrpcRouterClient
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor
from services.postprocessor.worker_client import GrpcWorkerClient


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    try:
        chat_processor = load_chat_processor(cfg.chat_processor)  # vllm / sglang: their import takes seconds
    except ChatProcessorUnavailable as e:
        raise SystemExit(f"postprocessor: {e}") from None
    serve_metrics(cfg.metrics_port, cfg.host)
    postprocessor_metrics()  # every documented name from the first scrape, not the first request
    tls = mesh_tls.from_config(cfg)
    router = GrpcRouterClient(cfg.router, tls) if cfg.router and cfg.migration_limit else None
    workers = MuxWorkerClient(tls) if cfg.worker_transport == "mux" else GrpcWorkerClient(tls)
    postprocessor = Postprocessor(workers, migrator=Migrator(router, cfg.migration_limit),
                                  idle_timeout_s=cfg.stream_idle_timeout_s, chat_processor=chat_processor)
    server = GrpcServer("postprocessor", cfg.host, cfg.port, grace_s=cfg.drain_grace_s, tls=tls)
    servicer = PostprocessorServicer(postprocessor)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(servicer, server.server)
    try:
        await server.serve_until_signal()
    finally:
        await postprocessor.close()
        await workers.close()
        if router is not None:
            await router.close()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
