"""Builds the router from its config: policy, KV event ingest and subscriber, replica sync, metrics.

Used by the router's own process (main.py) and by the all-in-one process (services/allinone), so
both shapes honour every router flag (``--router-mode kv`` indexes workers' KV events in both).
``build_router`` (a router for a --router-mode, its policy wired) is the tests' way to make one too.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from services.common.assembly import Built
from services.common.discovery import WorkerRegistry
from services.common.namespace import Namespace
from services.common.overload import BusyThreshold
from services.router.config import RouterConfig
from services.router.core.conditional import DisaggSettings
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.load_model import LoadThresholds, WorkerLoads
from services.router.core.policies import KV_MODE, KvSettings, build_policy, kv_policy
from services.router.core.policies.kv_aware import KvAware
from services.router.core.sessions import SessionAffinity
from services.router.core.wait_queue import WaitQueue
from services.router.core.worker_gate import WorkerGate
from services.router.events import KvEventSubscriber, ReplicaSync
from services.router.metrics import RouterMetrics
from services.router.service import Router, WorkerLookup


def kv_router(workers_for: WorkerLookup, policy: KvAware, busy: BusyThreshold | None = None,
              queue_timeout_s: float = 0.0, disagg: DisaggSettings | None = None) -> Router:
    """A router choosing by the kv ``policy``, which also serves as its view of caches and load (Router ``kv``)
    and hears its lifecycle: every booking, first token and release, first among the listeners (before the
    metrics and the replica sync the caller adds), so its per-request load moves with the bookings."""
    router = Router(workers_for, policy, busy=busy, queue_timeout_s=queue_timeout_s, disagg=disagg, kv=policy)
    router.listeners.insert(0, policy)
    return router


def build_router(workers_for: WorkerLookup, mode: str, kv: KvSettings | None = None,
                 ingest: KvEventIngest | None = None, busy: BusyThreshold | None = None,
                 queue_timeout_s: float = 0.0, disagg: DisaggSettings | None = None) -> Router:
    """A router choosing by ``mode`` (--router-mode); kv with ``kv`` (default settings when None), reading
    ``ingest`` (core/policies ``kv_policy``)."""
    if mode == KV_MODE:
        return kv_router(workers_for, kv_policy(kv or KvSettings(), ingest), busy, queue_timeout_s, disagg)
    return Router(workers_for, build_policy(mode), busy=busy, queue_timeout_s=queue_timeout_s, disagg=disagg)


def load_thresholds(cfg: RouterConfig) -> BusyThreshold:
    """--max-in-flight-per-worker and Dynamo's load thresholds (core/load_model.py); a plain request count
    when none of Dynamo's is set (nothing else to track)."""
    thresholds = LoadThresholds(cfg.max_in_flight_per_worker, cfg.active_decode_blocks_threshold,
                                cfg.active_prefill_tokens_threshold, cfg.active_prefill_tokens_threshold_frac,
                                cfg.router_queue_threshold, WorkerLoads(cfg.router_track_prefill_tokens))
    return thresholds if thresholds.reads_loads else BusyThreshold(cfg.max_in_flight_per_worker)


def build(cfg: RouterConfig, registry: WorkerRegistry, metrics_registry: CollectorRegistry = REGISTRY) -> Built[Router]:
    """The router over ``registry`` (subscribed to it; the caller starts it after building).

    Parts: ``ingest`` (the KV event ingest, None outside kv mode or with --no-router-kv-events), ``events``
    (its NATS subscriber), ``sync`` (replica sync), ``metrics``. ``metrics_registry`` defaults to the
    process registry, so that /metrics also has process_* and python_gc_* like every service.
    """
    ingest = KvEventIngest() if cfg.router_mode == KV_MODE and cfg.router_kv_events else None
    kv = KvSettings(overlap_weight=cfg.kv_overlap_weight, temperature=cfg.router_temperature,
                    hotspot_ratio=cfg.hotspot_ratio, ttl_s=cfg.router_ttl_secs,
                    cache_policy=cfg.router_approximate_cache_policy, cost=cfg.kv_cost)
    router = build_router(registry.workers_for, cfg.router_mode, kv, ingest, busy=load_thresholds(cfg),
                          queue_timeout_s=cfg.queue_timeout_s, disagg=cfg.disagg)
    router.queue = WaitQueue(classes=cfg.policy_classes)  # before the metrics read its depths
    router.gate = WorkerGate(cfg.router_min_initial_workers)  # before the registry's first cards reach it
    router.sessions = SessionAffinity(affinity_ttl_s=cfg.router_session_affinity_ttl_secs,
                                      mode=cfg.router_session_affinity_mode)
    registry.subscribe(router.on_worker_change)
    loads = router.loads
    if loads is not None:
        registry.subscribe(lambda worker_id, card: None if card is not None else loads.drop_worker(worker_id))
        if ingest is not None:  # the workers' load reports ride on their KV events
            ingest.load_listeners.append(
                lambda worker_id, blocks: loads.note_report(worker_id, blocks, ingest.loads[worker_id].total_blocks))
    metrics = RouterMetrics(registry=metrics_registry, ingest=ingest,
                            policy_stats=router.kv.stats if router.kv is not None else None,
                            queued=router.queue.depths, sessions=lambda: len(router.sessions),
                            disagg_decisions=router.disagg.decisions, lora_decisions=router.lora.decisions,
                            booked=router.bookings.per_worker)
    router.listeners.append(metrics)
    built = Built(router, parts={"ingest": ingest, "events": None, "sync": None, "metrics": metrics})
    if ingest is not None:
        events = KvEventSubscriber(cfg.nats_url, ingest, lambda w: w in registry.workers, metrics.observe_lag,
                                   namespaces=registry.namespaces)
        registry.subscribe(events.on_worker_change)
        built.background.append(events.start)  # NATS may come up after us
        built.closers.append(events.close)
        built.parts["events"] = events
    if cfg.router_replica_sync:
        sync = ReplicaSync(cfg.nats_url, router.apply, namespace=Namespace.of(cfg.namespace))
        router.listeners.append(sync)
        built.background.append(sync.start)
        built.closers.append(sync.close)
        built.parts["sync"] = sync
    return built

