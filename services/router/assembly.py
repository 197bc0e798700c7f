"""Builds the router from its config: policy, KV event ingest and subscriber, replica sync, metrics.

Used by the router's own process (main.py) and by the all-in-one process (services/allinone), so
both shapes honour every router flag (``--router-mode kv`` indexes workers' KV events in both).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.overload import BusyThreshold
from services.router.config import RouterConfig
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies import KvSettings, build_policy
from services.router.events import KvEventSubscriber, ReplicaSync
from services.router.metrics import RouterMetrics
from services.router.service import Router


def build(cfg: RouterConfig, registry: WorkerRegistry, metrics_registry: CollectorRegistry = REGISTRY) -> Built[Router]:
    """The router over ``registry`` (subscribed to it; the caller starts it after building).

    Parts: ``ingest`` (the KV event ingest, None outside kv mode or with --no-kv-events), ``events``
    (its NATS subscriber), ``sync`` (replica sync), ``metrics``. ``metrics_registry`` defaults to the
    process registry, so that /metrics also has process_* and python_gc_* like every service.
    """
    ingest = KvEventIngest() if cfg.router_mode == "kv" and cfg.kv_events else None
    kv = KvSettings(overlap_weight=cfg.kv_overlap_weight, temperature=cfg.router_temperature,
                    hotspot_ratio=cfg.hotspot_ratio, ttl_s=cfg.router_ttl_secs)
    router = Router(registry.workers_for, build_policy(cfg.router_mode, kv, ingest),
                    busy=BusyThreshold(cfg.max_in_flight_per_worker), queue_timeout_s=cfg.queue_timeout_s,
                    disagg=cfg.disagg)
    registry.subscribe(router.on_worker_change)
    metrics = RouterMetrics(registry=metrics_registry, ingest=ingest, policy_stats=router.policy.stats,
                            queued=router.queue.depths, sessions=lambda: len(router.sessions),
                            disagg_decisions=router.disagg.decisions, lora_decisions=router.lora.decisions,
                            booked=router.bookings.per_worker)
    router.listeners.append(metrics)
    built = Built(router, parts={"ingest": ingest, "events": None, "sync": None, "metrics": metrics})
    if ingest is not None:
        events = KvEventSubscriber(cfg.nats_url, ingest, lambda w: w in registry.workers, metrics.observe_lag)
        registry.subscribe(events.on_worker_change)
        built.background.append(events.start)  # NATS may come up after us
        built.closers.append(events.close)
        built.parts["events"] = events
    if cfg.router_replica_sync:
        sync = ReplicaSync(cfg.nats_url, router.apply)
        router.listeners.append(sync)
        built.background.append(sync.start)
        built.closers.append(sync.close)
        built.parts["sync"] = sync
    return built

