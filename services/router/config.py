"""Router configuration: flags with MESHFRONT_ROUTER_* env twins."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping, Sequence

from services.common.flags import FlagParser, Flags, add_common_flags, common_errors, config_from
from services.common.namespace import DEFAULT as DEFAULT_NAMESPACE
from services.router.core import policy_classes
from services.router.core.conditional import DisaggSettings, parse_settings
from services.router.core.policies import POLICY_NAMES, KvCost
from services.router.core.policies.kv_cost import DEFAULT_COST
from services.router.core.sessions import AFFINITY_MODES, MAX_AFFINITY_TTL_S, SOFT
from services.router.core.wait_queue import FCFS, QUEUE_POLICIES

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
    # Dynamo's load model (core/load_model.py): busy thresholds (None: that check is off) and the queue threshold.
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None
    router_queue_threshold: float | None = None
    router_queue_policy: str = FCFS
    # Dynamo's YAML of policy classes (core/policy_classes.py): weighted fair classes in the queue; "" = one class.
    router_policy_config: str = ""
    router_approximate_cache_policy: str = "ttl"
    # Dynamo's kv cost flags (core/policies/kv_cost.py), their defaults Dynamo's (track_output_blocks: ours).
    router_kv_overlap_score_credit: float = DEFAULT_COST.overlap_score_credit
    router_kv_overlap_score_credit_decay: float = DEFAULT_COST.overlap_score_credit_decay
    router_prefill_load_scale: float = DEFAULT_COST.prefill_load_scale
    router_decode_active_request_weight: float = DEFAULT_COST.decode_active_request_weight
    router_track_active_blocks: bool = DEFAULT_COST.track_active_blocks
    router_track_output_blocks: bool = DEFAULT_COST.track_output_blocks
    router_assume_kv_reuse: bool = DEFAULT_COST.assume_kv_reuse
    router_track_prefill_tokens: bool = DEFAULT_COST.track_prefill_tokens

    @property
    def kv_cost(self) -> KvCost:
        return KvCost(self.router_kv_overlap_score_credit, self.router_kv_overlap_score_credit_decay,
                      self.router_prefill_load_scale, self.router_decode_active_request_weight,
                      self.router_track_active_blocks, self.router_track_output_blocks, self.router_assume_kv_reuse,
                      self.router_track_prefill_tokens)

    @property
    def policy_classes(self) -> policy_classes.PolicyClasses:
        """The queue's classes (``validate`` has read the file once already)."""
        return policy_classes.load(self.router_policy_config, self.router_queue_policy)

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
        errors += _load_errors(self) + self.kv_cost.errors()
        for part in ("disagg", "policy_classes"):
            try:
                getattr(self, part)
            except ValueError as e:
                errors.append(str(e))
        if errors:
            raise ValueError("; ".join(errors))


def _load_errors(cfg: RouterConfig) -> list[str]:
    """Dynamo's bounds on its load thresholds (worker_monitor.rs LoadThresholdConfig::validate, and >= 0)."""
    errors = []
    frac = cfg.active_decode_blocks_threshold
    if frac is not None and not (math.isfinite(frac) and 0 <= frac <= 1):
        errors.append(f"--active-decode-blocks-threshold {frac:g} must be between 0.0 and 1.0 (None = off)")
    if cfg.active_prefill_tokens_threshold is not None and cfg.active_prefill_tokens_threshold < 0:
        errors.append(f"--active-prefill-tokens-threshold {cfg.active_prefill_tokens_threshold} must be >= 0 "
                      "(None = off)")
    for flag, value in (("--active-prefill-tokens-threshold-frac", cfg.active_prefill_tokens_threshold_frac),
                        ("--router-queue-threshold", cfg.router_queue_threshold)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            errors.append(f"{flag} {value:g} must be finite and >= 0 (None = off)")
    return errors


def _optional(kind: type[float] | type[int]):
    """A Dynamo threshold's value: a number, or 'None' (the check is off), as Dynamo's flags take it."""
    def parse(text: str) -> float | int | None:
        if text.strip() in ("None", "none", ""):
            return None
        return kind(text)
    parse.__name__ = kind.__name__  # argparse's "invalid float value" names the type
    return parse


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
    _add_load_flags(p)
    _add_cost_flags(p)
    p.add("--queue-timeout-s", default=0.0, type=float,
          help="with --max-in-flight-per-worker: how long a request may wait for a busy model, served in "
               "priority order (nvext.agent_hints.priority), before the 503 (0 = fail at once)")


def _add_load_flags(p: Flags) -> None:
    """Dynamo's busy thresholds, queue and approximate-cache flags (core/load_model.py, core/wait_queue.py)."""
    p.add("--active-decode-blocks-threshold", default=None, type=_optional(float),
          dynamo_env="DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD",
          help="a worker whose active KV blocks (booked prompts, or its load report when more) exceed this "
               "fraction of its KV blocks is busy; 'None' = off. Busy checks OR together")
    p.add("--active-prefill-tokens-threshold", default=None, type=_optional(int),
          dynamo_env="DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD",
          help="a worker with more prompt tokens than this still to prefill (booked, less the predicted cache, "
               "until the first token) is busy; 'None' = off")
    p.add("--active-prefill-tokens-threshold-frac", default=None, type=_optional(float),
          dynamo_env="DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC",
          help="as --active-prefill-tokens-threshold, as a fraction of the worker's max_num_batched_tokens; "
               "'None' = off")
    p.add("--router-queue-threshold", default=None, type=_optional(float), dynamo_env="DYN_ROUTER_QUEUE_THRESHOLD",
          help="hold requests in the router's queue while every worker has more prefill tokens in flight than "
               "this fraction of its max_num_batched_tokens (0 = while every one has any); they wait as long "
               "as their client, or --queue-timeout-s; 'None' = off")
    p.add("--router-queue-policy", default=FCFS, choices=QUEUE_POLICIES, dynamo_env="DYN_ROUTER_QUEUE_POLICY",
          help="the router queue's order: fcfs = arrival with priority bumps (tail wait), wspt = weighted "
               "shortest processing time, (1 + priority) / uncached prompt tokens (mean wait); without "
               "--router-policy-config, of its one class")
    p.add("--router-policy-config", default="", dynamo_env="DYN_ROUTER_POLICY_CONFIG",
          help="Dynamo's policy-class YAML: policy_classes[] (name, policy_family, cache_bucket, quantum = weight, "
               "queue_policy) with default_policy_family and one uncached_isl_buckets entry. Waiting requests are "
               "served weighted fair between classes, tenants in turn within one; a request's class comes from "
               "its key or the x-dynamo-meta-policy-class header, batch lines run in the lowest. Only where "
               "requests queue (--queue-timeout-s, --router-queue-threshold). docs/architecture.md, 'Overload'")
    p.add("--router-approximate-cache-policy", default="ttl", choices=("ttl", "lru"),
          dynamo_env="DYN_ROUTER_APPROXIMATE_CACHE_POLICY",
          help="kv approximate mode (--no-router-kv-events): forget predicted blocks after --router-ttl-secs "
               "(ttl), or least recently used first beyond each worker's advertised KV blocks (lru)")


def _add_cost_flags(p: Flags) -> None:
    """Dynamo's kv cost flags (core/policies/kv_cost.py; docs/architecture.md, 'KV-aware routing')."""
    p.add("--router-kv-overlap-score-credit", default=DEFAULT_COST.overlap_score_credit, type=float,
          dynamo_env="DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT",
          help="kv: prefill blocks credited per cached prompt block (> 1: extra credit; the prefill is clamped at 0)")
    p.add("--router-kv-overlap-score-credit-decay", default=DEFAULT_COST.overlap_score_credit_decay, type=float,
          dynamo_env="DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY",
          help="kv: shrink a worker's overlap credit as its prefill in flight exceeds the least loaded one's "
               "(1 halves it at one prompt's worth); 0 = off")
    p.add("--router-prefill-load-scale", default=DEFAULT_COST.prefill_load_scale, type=float,
          dynamo_env="DYN_ROUTER_PREFILL_LOAD_SCALE",
          help="kv: scale of the prefill term, multiplied with --kv-overlap-weight")
    p.add("--router-decode-active-request-weight", default=DEFAULT_COST.decode_active_request_weight, type=float,
          dynamo_env="DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT",
          help="kv: blocks of cost added per request running on a worker")
    p.add("--router-track-active-blocks", default=True, type=bool, aliases=("--track-active-blocks",),
          dynamo_env="DYN_ROUTER_TRACK_ACTIVE_BLOCKS", help="kv: weigh each worker's active decode blocks")
    p.add("--router-track-output-blocks", default=True, type=bool, aliases=("--track-output-blocks",),
          dynamo_env="DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
          help="kv: count the blocks a worker reports in use beyond the booked prompts (its output tokens')")
    p.add("--router-assume-kv-reuse", default=True, type=bool, aliases=("--assume-kv-reuse",),
          dynamo_env="DYN_ROUTER_ASSUME_KV_REUSE",
          help="kv: requests on one worker share the blocks of a common prefix (off: each holds its own)")
    p.add("--router-track-prefill-tokens", default=True, type=bool, dynamo_env="DYN_ROUTER_TRACK_PREFILL_TOKENS",
          help="count prompt tokens as prefill load: the kv cost, the busy and queue thresholds")


def from_args(args: argparse.Namespace) -> RouterConfig:
    """The config from parsed flags (common and own ones); raises ValueError for invalid settings."""
    cfg = config_from(RouterConfig, args)
    cfg.validate()
    return cfg
