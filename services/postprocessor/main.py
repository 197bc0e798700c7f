"""The postprocessor process: Postprocessor (services/postprocessor/assembly.py) -> PostprocessorService."""

from __future__ import annotations

from collections.abc import Sequence

from meshfront.postprocessor.v1 import postprocessor_pb2_grpc

from services.common import service_main
from services.common.assembly import Built
from services.common.grpc_server import GrpcServer
from services.postprocessor.assembly import build
from services.postprocessor.config import parse_config
from services.postprocessor.core.parsers.backends import ChatProcessorUnavailable
from services.postprocessor.metrics import postprocessor_metrics
from services.postprocessor.server import PostprocessorServicer
from services.postprocessor.service import Postprocessor


def _serve(postprocessor: Built[Postprocessor], server: GrpcServer) -> None:
    servicer = PostprocessorServicer(postprocessor.service)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(servicer, server.server)
    server.on_drain(servicer.sessions.drain)  # multiplexed streams end when their running requests have


SPEC = service_main.ServiceSpec(name="postprocessor", parse=parse_config, build=build, serve=_serve,
                                metrics=postprocessor_metrics, unavailable=(ChatProcessorUnavailable,))


def main(argv: Sequence[str] | None = None) -> None:
    service_main.main(SPEC, argv)
