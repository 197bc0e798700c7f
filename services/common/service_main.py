"""One entry-point shape for every service process: gateway, preprocessor, router, postprocessor, all-in-one.

``main(spec, argv)`` does, in this order:

1. parse ``argv`` (flags and env twins); a bad value, whether argparse or the config's ``validate``
   finds it, is one line on stderr (``meshfront router: --queue-timeout-s -5 must be >= 0``) and exit
   status 2, before anything binds or connects; so is a TLS file that cannot be read (``--tls-*``,
   ``--nats-tls-*``);
2. logging and the process's NATS TLS (``nats_connection.use_tls``), then ``/metrics``
   (``--metrics-port``) with every family of the service registered, so the first scrape has every
   documented name;
3. the worker registry (the NATS discovery mirror), and the service's own ``build`` over it;
4. one gRPC server with one drain grace (``--drain-grace-s``), to which the service adds its servicer;
5. start: background work, then the registry (and, where the spec asks, its first view of the
   workers), then the server, until SIGTERM/SIGINT;
6. the closers, once in-flight calls have finished: the service's, then the registry's.

A build that finds its environment lacking (an engine backend that is not installed) names the
reason on one line and exits 1: not a bad value, so not 2. Workers have their own shape
(services/workers/entry.py): they load a model and register themselves instead of watching others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from services.common import nats_connection, nats_tls, static_model, tracing
from services.common import tls as mesh_tls
from services.common.debug_perf import configure as configure_debug_perf
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import serve_metrics
from services.common.namespace import DiscoveryFilter


class ServiceConfig(Protocol):
    """The common flags (services/common/flags.py ``add_common_flags``) every service config carries
    (read-only: the configs are frozen dataclasses)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def nats_url(self) -> str: ...

    @property
    def log_level(self) -> str: ...

    @property
    def metrics_port(self) -> int: ...

    @property
    def drain_grace_s(self) -> float: ...

    @property
    def tls_cert(self) -> str: ...

    @property
    def tls_key(self) -> str: ...

    @property
    def tls_ca(self) -> str: ...

    @property
    def dyn_debug_perf(self) -> bool: ...

    @property
    def namespace(self) -> str: ...

    @property
    def namespace_prefix(self) -> str: ...

    @property
    def static_model(self) -> str: ...

    @property
    def static_model_block_size(self) -> int: ...


class Service(Protocol):
    """What a service's ``build`` returns (``services.common.assembly.Built`` is one)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=ServiceConfig)
S = TypeVar("S", bound=Service)


FIRST_VIEW_WAIT_S = 10.0


@dataclasses.dataclass(frozen=True)
class ServiceSpec(Generic[C, S]):
    """How one service process is made; its ``main.py`` declares one and calls ``main(SPEC, argv)``."""

    name: str  # the command (``meshfront router``): messages and the registry's name
    parse: Callable[[Sequence[str]], C]  # raises ValueError naming every bad value
    build: Callable[[C, WorkerRegistry, mesh_tls.MeshTls | None], S]
    serve: Callable[[S, GrpcServer], None]  # adds the servicer (and its drain hooks) to the server
    metrics: Callable[[], object] | None = None  # registers every family of the service
    # Errors of ``build`` that mean "this environment cannot run it": one line and exit 1.
    unavailable: tuple[type[Exception], ...] = ()
    server_name: str = ""  # the gRPC server's name in logs and READY lines; default ``name``
    # Listen only once the registry has its first view of the workers, waiting at most this long (NATS may
    # be down: then it listens with no view, as before). A restarted stage is sent requests as soon as it
    # listens (its callers retried them while the port was closed), and before its first discovery view it
    # would answer them "model does not exist": a 404 for a model that is served (seen from a router
    # SIGKILLed under arriving requests through `meshfront run`).
    first_view_wait_s: float = FIRST_VIEW_WAIT_S


def bad_value(name: str, message: object) -> NoReturn:
    """A bad flag or env value: one line on stderr, exit status 2 (argparse's status for usage errors)."""
    print(f"meshfront {name}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def parse_or_exit(name: str, parse: Callable[[Sequence[str]], C], argv: Sequence[str]) -> C:
    try:
        return parse(argv)
    except ValueError as e:
        bad_value(name, e)


def main(spec: ServiceSpec[C, Any], argv: Sequence[str] | None = None) -> None:
    """Runs the service of ``spec`` until SIGTERM/SIGINT; ``argv`` defaults to the process's own."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg = parse_or_exit(spec.name, spec.parse, argv)
    try:
        tls = mesh_tls.from_config(cfg)
        nats_context = nats_tls.context(nats_tls.from_argv(argv))
    except (ValueError, OSError) as e:  # a --tls-* pair half given, a file that cannot be read
        bad_value(spec.name, e)
    setup_logging(cfg.log_level)
    configure_debug_perf(cfg.dyn_debug_perf)
    nats_connection.use_tls(nats_context)
    tracing.configure(spec.name)  # on only when the environment names an OTLP collector
    run(lambda: serve(spec, cfg, tls))


async def serve(spec: ServiceSpec[C, S], cfg: C, tls: mesh_tls.MeshTls | None) -> None:
    serve_metrics(cfg.metrics_port, cfg.host)
    if spec.metrics is not None:
        spec.metrics()
    try:
        static = static_model.parse(cfg.static_model, cfg.static_model_block_size)
    except ValueError as e:
        print(f"meshfront {spec.name}: {e}", file=sys.stderr)  # a bad flag combination: one line, status 2
        sys.exit(2)
    registry = WorkerRegistry(cfg.nats_url, spec.name, namespaces=DiscoveryFilter(cfg.namespace, cfg.namespace_prefix),
                              static=static)
    try:
        service = spec.build(cfg, registry, tls)
    except spec.unavailable as e:
        raise SystemExit(f"meshfront {spec.name}: {e}") from None
    server = GrpcServer(spec.server_name or spec.name, cfg.host, cfg.port, grace_s=cfg.drain_grace_s, tls=tls)
    spec.serve(service, server)
    service.start()  # background work that waits for NATS, which may come up after us
    await registry.start()
    if spec.first_view_wait_s:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(spec.first_view_wait_s):
                await registry.synced.wait()
    server.on_stopped(service.close)
    server.on_stopped(registry.close)
    await server.serve_until_signal()
