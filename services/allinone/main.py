"""The all-in-one process: one discovery mirror, every stage in-process, the gateway's gRPC server."""

from __future__ import annotations

from collections.abc import Sequence

from services.allinone.assembly import AllInOne, build
from services.allinone.config import parse_config
from services.common import service_main
from services.common.grpc_server import GrpcServer
from services.postprocessor.core.parsers.backends import ChatProcessorUnavailable
from services.postprocessor.metrics import postprocessor_metrics


def _serve(mesh: AllInOne, server: GrpcServer) -> None:
    mesh.gateway.service.add_to(server)


# One /metrics for the process: the gateway's and the router's families register in their builds, the
# postprocessor's here. (The preprocessor's count PreprocessorService calls, which this process makes none of.)
SPEC = service_main.ServiceSpec(name="allinone", parse=parse_config, build=build, serve=_serve,
                                metrics=postprocessor_metrics,
                                unavailable=(ChatProcessorUnavailable,), server_name="gateway")


def main(argv: Sequence[str] | None = None) -> None:
    service_main.main(SPEC, argv)
