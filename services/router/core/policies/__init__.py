"""Routing policies: one file each, one interface (base.py), all built here by ``build_policy``.

A policy gets the live candidates for a model (never empty) and the query, and returns a Decision.
State a policy needs lives in its own instance (a counter, an RNG, kv's per-request load); load the
router booked lives in the candidates it is given.
"""

from __future__ import annotations

import dataclasses

from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies.base import Policy
from services.router.core.policies.direct import Direct
from services.router.core.policies.kv_aware import DEFAULT_HOTSPOT_RATIO, DEFAULT_OVERLAP_WEIGHT, KvAware
from services.router.core.policies.least_loaded import LeastLoaded
from services.router.core.policies.random_choice import RandomChoice
from services.router.core.policies.round_robin import RoundRobin

__all__ = ["DEFAULT_MODE", "POLICY_NAMES", "KvSettings", "Policy", "build_policy", "policy_name"]

POLICY_NAMES = ("round-robin", "random", "least-loaded", "direct", "kv")
DEFAULT_MODE = "round-robin"
_NAME_OF = {RoundRobin: "round-robin", RandomChoice: "random", LeastLoaded: "least-loaded", Direct: "direct",
            KvAware: "kv"}


def policy_name(policy: Policy) -> str:
    """The --router-mode name of a policy built by ``build_policy`` (a decision record names it)."""
    return _NAME_OF[type(policy)]


@dataclasses.dataclass(frozen=True)
class KvSettings:
    """The kv policy's parameters (router flags --kv-overlap-weight, --router-temperature,
    --hotspot-ratio, --router-ttl-secs); see kv_aware.py for what each weighs."""

    overlap_weight: float = DEFAULT_OVERLAP_WEIGHT
    temperature: float = 0.0
    hotspot_ratio: float = DEFAULT_HOTSPOT_RATIO
    ttl_s: float = 120.0  # approximate mode: how long a block the router predicted stays predicted


def build_policy(mode: str, kv: KvSettings = KvSettings(), ingest: KvEventIngest | None = None) -> Policy:
    """The policy named ``mode`` (--router-mode). kv reads the workers' KV events through ``ingest``,
    or, without one (--no-kv-events), predicts caches from its own decisions (approximate mode)."""
    if mode == "round-robin":
        return RoundRobin()
    if mode == "random":
        return RandomChoice()
    if mode == "least-loaded":
        return LeastLoaded()
    if mode == "direct":
        return Direct()
    if mode == "kv":
        if ingest is None:
            return KvAware(overlap_weight=kv.overlap_weight, temperature=kv.temperature,
                           hotspot_ratio=kv.hotspot_ratio, approximate=True, ttl_s=kv.ttl_s)
        policy = KvAware(overlap_weight=kv.overlap_weight, temperature=kv.temperature,
                         hotspot_ratio=kv.hotspot_ratio, index=ingest.index, approximate=False)
        ingest.load_listeners.append(policy.note_report)  # the workers' own block counts refine the bookings
        return policy
    raise ValueError(f"unknown router mode {mode!r}; choose one of {', '.join(POLICY_NAMES)}")
