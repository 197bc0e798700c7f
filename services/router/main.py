"""The router process: discovery mirror -> Router (services/router/assembly.py) -> RouterService."""

from __future__ import annotations

from collections.abc import Sequence

from meshfront.router.v1 import router_pb2_grpc

from services.common import service_main
from services.common.assembly import Built
from services.common.grpc_server import GrpcServer
from services.router.assembly import build
from services.router.config import parse_config
from services.router.server import RouterServicer
from services.router.service import Router


def _serve(router: Built[Router], server: GrpcServer) -> None:
    servicer = RouterServicer(router.service, router.parts["metrics"].route_duration)
    router_pb2_grpc.add_RouterServiceServicer_to_server(servicer, server.server)
    if not router.service.gate.is_open:  # --router-min-initial-workers: not SERVING before the workers are
        server.ready_when(router.service.gate.wait)


# The router's metrics (services/router/metrics.py) are registered by its build.
SPEC = service_main.ServiceSpec(name="router", parse=parse_config,
                                build=lambda cfg, registry, _tls: build(cfg, registry), serve=_serve)


def main(argv: Sequence[str] | None = None) -> None:
    service_main.main(SPEC, argv)
