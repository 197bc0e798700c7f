"""Router configuration: flags with MESHFRONT_ROUTER_* env twins."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, Flags, add_common_flags, common_errors, config_from
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.router.core.conditional import DisaggSettings, parse_settings
from services.router.core.policies import POLICY_NAMES
from services.router.core.sessions import AFFINITY_MODES, MAX_AFFINITY_TTL_S, SOFT

DEFAULT_PORT = 9300


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    host: str
    port: int
    nats_url: str
    log_level: str
    metrics_port: int
    router_mode: str
    max_in_flight_per_worker: int
    kv_overlap_weight: float = 5.0
    router_temperature: float = 0.0
    router_kv_events: bool = True
    router_ttl_secs: float = 120.0
    hotspot_ratio: float = 3.0
    router_replica_sync: bool = True
    queue_timeout_s: float = 0.0
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    dyn_debug_perf: bool = False  # --dyn-debug-perf, a common flag (services/common/debug_perf.py)
    # --namespace / --namespace-prefix (services/common/namespace.py): whose workers it sees, where its own
    # NATS subjects and stores live.
    namespace: str = DEFAULT_NAMESPACE
    namespace_prefix: str = ""
    # --static-model NAME=DIR and its block size (services/common/static_model.py): cards of NAME read DIR.
    static_model: str = ""
    static_model_block_size: int = 0
    drain_grace_s: float = 10.0
    router_conditional_disagg: bool = False
    router_conditional_disagg_config: str = ""
    enforce_disagg: bool = False
    router_min_initial_workers: int = 0
    router_session_affinity_ttl_secs: int = 0
    router_session_affinity_mode: str = SOFT

    @property
    def disagg(self) -> DisaggSettings:
        """Disaggregation settings (core/conditional.py); ``validate`` has checked them."""
        return parse_settings(self.router_conditional_disagg, self.router_conditional_disagg_config,
                              self.enforce_disagg)

    def validate(self) -> None:
        """Raises ValueError listing every invalid setting, whichever policy is chosen: a value that
        only the kv policy reads is still a mistake under round-robin (and the next --router-mode kv)."""
        errors = common_errors(self.port, self.drain_grace_s)
        if self.max_in_flight_per_worker < 0:
            errors.append(f"--max-in-flight-per-worker {self.max_in_flight_per_worker} must be >= 0 (0 = no limit)")
        if self.queue_timeout_s < 0:
            errors.append(f"--queue-timeout-s {self.queue_timeout_s:g} must be >= 0 (0 = fail at once)")
        if self.router_temperature < 0:
            errors.append(f"--router-temperature {self.router_temperature:g} must be >= 0 (0 = cheapest worker)")
        if self.kv_overlap_weight < 0:
            errors.append(f"--kv-overlap-weight {self.kv_overlap_weight:g} must be >= 0")
        if self.hotspot_ratio < 1:
            errors.append(f"--hotspot-ratio {self.hotspot_ratio:g} must be >= 1 (a multiple of a fair share)")
        if self.router_min_initial_workers < 0:
            errors.append(f"--router-min-initial-workers {self.router_min_initial_workers} must be >= 0 (0 = no wait)")
        if not 0 <= self.router_session_affinity_ttl_secs <= MAX_AFFINITY_TTL_S:
            errors.append(f"--router-session-affinity-ttl-secs {self.router_session_affinity_ttl_secs} must be "
                          f"between 1 and {MAX_AFFINITY_TTL_S} (0 = header session affinity off)")
        if self.router_ttl_secs <= 0:
            errors.append(f"--router-ttl-secs {self.router_ttl_secs:g} must be > 0")
        try:
            _ = self.disagg
        except ValueError as e:
            errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors))


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> RouterConfig:
    p = FlagParser("router", "Chooses a worker for each request.", env)
    add_common_flags(p, port=DEFAULT_PORT)
    add_flags(p)
    return from_args(p.parse(argv))


def add_flags(p: Flags) -> None:
    """The router's own flags (not the common ones); the all-in-one process offers them too."""
    p.add("--router-mode", default="round-robin", choices=POLICY_NAMES, help="routing policy",
          dynamo_env="DYN_ROUTER_MODE")
    p.add("--kv-overlap-weight", default=5.0, type=float, help="kv: weight of prefill blocks against decode load")
    p.add("--router-temperature", default=0.0, type=float, help="kv: 0 = cheapest worker; > 0 = softmax sampling",
          dynamo_env="DYN_ROUTER_TEMPERATURE")
    # Dynamo's spelling; ours (--kv-events) stays an alias and keeps its env twin, so deployments that set
    # MESHFRONT_ROUTER_KV_EVENTS go on working.
    p.add("--router-kv-events", default=True, type=bool, aliases=("--kv-events",), env="MESHFRONT_ROUTER_KV_EVENTS",
          dynamo_env="DYN_ROUTER_USE_KV_EVENTS",
          help="kv: index workers' KV events (--no-router-kv-events: predict from own decisions, approximate mode)")
    p.add("--router-ttl-secs", default=120.0, type=float, help="kv approximate mode: life of a predicted block",
          dynamo_env="DYN_ROUTER_TTL_SECS")
    p.add("--hotspot-ratio", default=3.0, type=float,
          help="kv: a worker above this multiple of its fair share of in-flight requests is skipped")
    p.add("--router-replica-sync", default=True, type=bool,
          help="share with other router replicas over NATS the bookings their decisions read (every one under "
               "a load-reading policy or a busy threshold; else those of sessions, adapters, migrations and "
               "models with prefill workers)", dynamo_env="DYN_ROUTER_REPLICA_SYNC")
    p.add("--max-in-flight-per-worker", default=0, type=int,
          help="in-flight requests (booked by this router) that make a worker busy; when every worker "
               "of a model is busy, requests fail fast with 503 / RESOURCE_EXHAUSTED (0 = no limit)")
    p.add("--router-conditional-disagg", default=False, type=bool,
          help="with prefill workers: a request may run aggregated on its decode worker instead of split, as "
               "--router-conditional-disagg-config decides (Dynamo's flag)", dynamo_env="DYN_ROUTER_CONDITIONAL_DISAGG")
    p.add("--router-conditional-disagg-config", default="",
          help="JSON object (Dynamo's keys): policy isl_bounding|prefill_load|isl_or_load, eff_isl_threshold "
               "(2048), eff_isl_ratio_threshold (0.7), prefill_busy_threshold, decode_busy_threshold; and "
               "max_local_prefill_length (0: off). docs/architecture.md, 'Disaggregated prefill and decode'",
          dynamo_env="DYN_ROUTER_CONDITIONAL_DISAGG_CONFIG")
    p.add("--enforce-disagg", default=False, type=bool,
          help="never run a request aggregated for want of a prefill worker (none registered, all busy or "
               "excluded): fail it with 503 instead (Dynamo's flag; Dynamo 1.6.1 accepts and ignores it)",
          dynamo_env="DYN_ENFORCE_DISAGG")
    p.add("--router-min-initial-workers", default=0, type=int, dynamo_env="DYN_ROUTER_MIN_INITIAL_WORKERS",
          help="at start: hold Route calls and report NOT_SERVING until this many workers are registered; "
               "open for good from then on (0 = no wait)")
    p.add("--router-session-affinity-ttl-secs", default=0, type=int, dynamo_env="DYN_ROUTER_SESSION_AFFINITY_TTL_SECS",
          help="bind requests carrying an X-Dynamo-Session-ID header to one worker for this idle life in seconds "
               "(shared with router replicas); 0 = the header is ignored, as Dynamo ignores it when the flag is "
               "omitted (nvext.session_control sessions stick either way)")
    p.add("--router-session-affinity-mode", default=SOFT, choices=AFFINITY_MODES,
          dynamo_env="DYN_ROUTER_SESSION_AFFINITY_MODE",
          help="when a session's worker is busy: soft = route this request elsewhere, keeping the binding; hard = "
               "keep it on that worker (it waits with --queue-timeout-s, else 503); Dynamo's default is hard")
    p.add("--queue-timeout-s", default=0.0, type=float,
          help="with --max-in-flight-per-worker: how long a request may wait for a busy model, served in "
               "priority order (nvext.agent_hints.priority), before the 503 (0 = fail at once)")


def from_args(args: argparse.Namespace) -> RouterConfig:
    """The config from parsed flags (common and own ones); raises ValueError for invalid settings."""
    cfg = config_from(RouterConfig, args)
    cfg.validate()
    return cfg
