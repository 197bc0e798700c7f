"""The gateway process: discovery mirror, the three stage clients, GatewayService (behind Envoy)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common import service_main
from services.common.assembly import Built
from services.common.grpc_server import GrpcServer
from services.gateway.assembly import Gateway, build
from services.gateway.config import parse_config


def _serve(gateway: Built[Gateway], server: GrpcServer) -> None:
    gateway.service.add_to(server)


# The request metrics (frontend_metrics.py) are registered by the build, under --metrics-prefix.
SPEC = service_main.ServiceSpec(name="gateway", parse=parse_config, build=build, serve=_serve)


def main(argv: Sequence[str] | None = None) -> None:
    service_main.main(SPEC, argv)
