"""Routing policies: one file each, one interface (base.py ``Policy``), all built here.

A policy gets the live candidates for a model (never empty) and the query, and returns a Decision.
State a policy needs lives in its own instance (a counter, an RNG, kv's per-request load); load the
router booked lives in the candidates it is given. ``build_policy`` builds the policies that need
nothing else; kv, which also hears the request lifecycle, is built by ``kv_policy`` and wired into
its router by services/router/assembly.py ``kv_router`` (``build_router`` builds a router for any mode).
"""

from __future__ import annotations

import dataclasses

from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies.base import Policy
from services.router.core.policies.direct import Direct
from services.router.core.policies.kv_aware import DEFAULT_HOTSPOT_RATIO, DEFAULT_OVERLAP_WEIGHT, KvAware
from services.router.core.policies.kv_cost import KvCost
from services.router.core.policies.least_loaded import LeastLoaded
from services.router.core.policies.power_of_two import PowerOfTwo
from services.router.core.policies.random_choice import RandomChoice
from services.router.core.policies.round_robin import RoundRobin

__all__ = ["DEFAULT_MODE", "KV_MODE", "POLICY_NAMES", "KvCost", "KvSettings", "Policy", "build_policy", "kv_policy",
           "policy_name"]

KV_MODE = "kv"
# Each --router-mode whose policy only chooses, and its class (built with no arguments). kv is kv_policy's.
_CHOOSERS: dict[str, type[Policy]] = {"round-robin": RoundRobin, "random": RandomChoice,
                                      "least-loaded": LeastLoaded, "power-of-two": PowerOfTwo, "direct": Direct}
POLICY_NAMES = (*_CHOOSERS, KV_MODE)
DEFAULT_MODE = "round-robin"
_NAME_OF: dict[type, str] = {cls: name for name, cls in _CHOOSERS.items()} | {KvAware: KV_MODE}


def policy_name(policy: Policy) -> str:
    """The --router-mode name of a policy built by ``build_policy`` or ``kv_policy`` (a decision record names it)."""
    return _NAME_OF[type(policy)]


@dataclasses.dataclass(frozen=True)
class KvSettings:
    """The kv policy's parameters (router flags --kv-overlap-weight, --router-temperature,
    --hotspot-ratio, --router-ttl-secs, --router-approximate-cache-policy, and Dynamo's cost flags in
    ``cost``); see kv_aware.py and kv_cost.py for what each weighs."""

    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    temperature: float = 0.0
    hotspot_ratio: float = DEFAULT_HOTSPOT_RATIO
    ttl_s: float = 120.0  # approximate mode: how long a block the router predicted stays predicted
    cache_policy: str = "ttl"  # approximate mode: ttl, or lru bounded by each worker's KV capacity
    cost: KvCost = KvCost()


def build_policy(mode: str) -> Policy:
    """The policy named ``mode`` (--router-mode) among those that only choose. kv is ``kv_policy``'s: a kv
    policy its router does not tell about bookings would weigh no load."""
    if mode in _CHOOSERS:
        return _CHOOSERS[mode]()
    if mode == KV_MODE:
        raise ValueError("the kv policy hears its router's lifecycle: build it with services.router.assembly "
                         "build_router (or kv_policy and kv_router)")
    raise ValueError(f"unknown router mode {mode!r}; choose one of {', '.join(POLICY_NAMES)}")


def kv_policy(kv: KvSettings = KvSettings(), ingest: KvEventIngest | None = None) -> KvAware:
    """The kv policy. It reads the workers' KV events through ``ingest``, or, without one (--no-kv-events),
    predicts caches from its own decisions (approximate mode)."""
    if ingest is None:
        return KvAware(overlap_weight=kv.overlap_weight, temperature=kv.temperature,
                       hotspot_ratio=kv.hotspot_ratio, approximate=True, ttl_s=kv.ttl_s,
                       cache_policy=kv.cache_policy, cost=kv.cost)
    policy = KvAware(overlap_weight=kv.overlap_weight, temperature=kv.temperature,
                     hotspot_ratio=kv.hotspot_ratio, index=ingest.index, approximate=False, cost=kv.cost)
    ingest.load_listeners.append(policy.note_report)  # the workers' own block counts refine the bookings
    return policy
