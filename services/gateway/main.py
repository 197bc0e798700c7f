"""Wires the gateway: discovery mirror, the three stage clients, the gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import serve_metrics
from services.gateway.assembly import build
from services.gateway.config import parse_config
from services.gateway.warmup import SYNC_WAIT_S


async def serve(argv: list[str]) -> None:
    try:
        cfg = parse_config(argv)
    except ValueError as e:
        raise SystemExit(f"gateway: {e}") from None
    setup_logging(cfg.log_level)
    serve_metrics(cfg.metrics_port, cfg.host)
    registry = WorkerRegistry(cfg.nats_url, "gateway")
    tls = mesh_tls.from_config(cfg)
    gateway = build(cfg, registry, tls)
    await registry.start()
    # Envoy sends a restarted gateway requests as soon as it listens (it retried them while the port was
    # closed): listening before the first discovery view would answer them "model does not exist".
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(registry.synced.wait(), SYNC_WAIT_S)
    server = GrpcServer("gateway", cfg.host, cfg.port, tls=tls)
    gateway.service.add_to(server)
    gateway.start()
    server.on_stopped(gateway.close)
    server.on_stopped(registry.close)
    await server.serve_until_signal()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
