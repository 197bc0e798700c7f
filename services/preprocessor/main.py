"""The preprocessor process: discovery mirror -> Preprocessor (assembly.py) -> PreprocessorService."""

from __future__ import annotations

from collections.abc import Sequence

from services.common import service_main
from services.common.assembly import Built
from services.common.grpc_server import GrpcServer
from services.preprocessor.assembly import build
from services.preprocessor.config import parse_config
from services.preprocessor.core.renderers import ChatRendererUnavailable
from services.preprocessor.metrics import preprocessor_metrics, register_prefix_cache_collector
from services.preprocessor.server import add_to_server
from services.preprocessor.service import Preprocessor


def _serve(preprocessor: Built[Preprocessor], server: GrpcServer) -> None:
    add_to_server(server, preprocessor.service)
    # The prefix cache's families, read at scrape time; here, since the all-in-one exports no preprocessor family.
    register_prefix_cache_collector()


# parse_config also reads and compiles --chat-template: a template that does not compile is a bad value.
SPEC = service_main.ServiceSpec(name="preprocessor", parse=parse_config,
                                build=lambda cfg, registry, _tls: build(cfg, registry), serve=_serve,
                                metrics=preprocessor_metrics, unavailable=(ChatRendererUnavailable,))


def main(argv: Sequence[str] | None = None) -> None:
    service_main.main(SPEC, argv)
