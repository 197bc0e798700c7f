"""Wires the router: discovery mirror -> Router -> gRPC server."""

from __future__ import annotations

import asyncio
import sys

from prometheus_client import REGISTRY

from meshfront.router.v1 import router_pb2_grpc
from services.common import tls as mesh_tls
from services.common.discovery import WorkerRegistry
from services.common.overload import BusyThreshold
from services.common.grpc_server import GrpcServer, run, setup_logging
from services.common.metrics import serve_metrics
from services.router.config import RouterConfig, parse_config
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies import make_policy
from services.router.events import KvEventSubscriber, ReplicaSync
from services.router.metrics import RouterMetrics
from services.router.server import RouterServicer
from services.router.service import Router


async def serve(argv: list[str]) -> None:
    cfg = parse_config(argv)
    setup_logging(cfg.log_level)
    registry = WorkerRegistry(cfg.nats_url, "router")
    ingest = KvEventIngest() if cfg.router_mode == "kv" and cfg.kv_events else None
    router = Router(registry.workers_for, cfg.router_mode, policy=_policy(cfg, ingest),
                    busy=BusyThreshold(cfg.max_in_flight_per_worker))
    registry.subscribe(router.on_worker_change)
    closers = [registry.close]
    # The process registry, so that /metrics also has process_* and python_gc_* like every service.
    metrics = RouterMetrics(registry=REGISTRY, ingest=ingest, policy_stats=getattr(router._policy, "stats", None))
    router.listeners.append(metrics)
    serve_metrics(cfg.metrics_port, cfg.host)
    background = []
    if ingest is not None:
        events = KvEventSubscriber(cfg.nats_url, ingest, lambda w: w in registry.workers, metrics.observe_lag)
        registry.subscribe(events.on_worker_change)
        background.append(events.start())
        closers.append(events.close)
    if cfg.router_replica_sync:
        sync = ReplicaSync(cfg.nats_url, router.apply)
        router.listeners.append(sync)
        background.append(sync.start())
        closers.append(sync.close)
    tasks = [asyncio.create_task(c) for c in background]  # NATS may come up after us
    await registry.start()
    server = GrpcServer("router", cfg.host, cfg.port, tls=mesh_tls.from_config(cfg))
    router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(router), server.server)
    for close in closers:
        server.on_stopped(close)
    server.on_stopped(lambda: _cancel(tasks))
    await server.serve_until_signal()


def _policy(cfg: RouterConfig, ingest: KvEventIngest | None):
    """The kv policy with its flags (and the event-fed index unless approximate); others by name."""
    if cfg.router_mode != "kv":
        return None
    if ingest is None:
        return make_policy("kv", overlap_weight=cfg.kv_overlap_weight, temperature=cfg.router_temperature,
                           hotspot_ratio=cfg.hotspot_ratio, approximate=True, ttl_s=cfg.router_ttl_secs)

    def reported(worker_id: str) -> int:
        load = ingest.loads.get(worker_id)
        return load.active_blocks if load is not None else 0

    return make_policy("kv", index=ingest.index, overlap_weight=cfg.kv_overlap_weight,
                       temperature=cfg.router_temperature, hotspot_ratio=cfg.hotspot_ratio, approximate=False,
                       reported_blocks=reported)


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for t in tasks:
        t.cancel()


def main() -> None:
    run(lambda: serve(sys.argv[1:]))
