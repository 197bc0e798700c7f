"""Wires the postprocessor: Postprocessor (with its worker channel pool) -> gRPC server."""

from __future__ import annotations

import sys

from meshfront.postprocessor.v1 import postprocessor_pb2_grpc
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.postprocessor.config import parse_config
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    postprocessor = Postprocessor()
    server = GrpcServer("postprocessor", cfg.host, cfg.port, grace_s=cfg.drain_grace_s)
    servicer = PostprocessorServicer(postprocessor)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(servicer, server.server)
    try:
        await server.serve_until_signal()
    finally:
        await postprocessor.close()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
