"""Routing policies: one file each, one narrow interface, a registry by kebab-case name.

A policy gets the live candidates for a model (never empty) and the query, and
returns a Decision. State a policy needs lives in its own instance (a counter,
an RNG); load lives in the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from services.router.core.types import Candidate, Decision, RouteQuery


class Policy(Protocol):
    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision: ...


def _registry() -> dict[str, Callable[..., Policy]]:
    from services.router.core.policies.direct import Direct
    from services.router.core.policies.kv_aware import KvAware
    from services.router.core.policies.least_loaded import LeastLoaded
    from services.router.core.policies.random_choice import RandomChoice
    from services.router.core.policies.round_robin import RoundRobin

    return {"round-robin": RoundRobin, "random": RandomChoice, "least-loaded": LeastLoaded, "direct": Direct,
            "kv": KvAware}


POLICY_NAMES = ("round-robin", "random", "least-loaded", "direct", "kv")


@runtime_checkable
class TracksRequests(Protocol):
    """A policy that keeps its own per-request state (kv): told about every request's lifecycle."""

    def book(self, request_id: str, worker_id: str, local_hashes: Sequence[int], overlap_blocks: int) -> None: ...

    def mark_prefilled(self, request_id: str) -> bool: ...

    def free(self, request_id: str) -> bool: ...

    def drop_worker(self, worker_id: str) -> None: ...


def make_policy(name: str, **kwargs) -> Policy:
    try:
        return _registry()[name](**kwargs)
    except KeyError:
        raise ValueError(f"unknown router mode {name!r}; choose one of {', '.join(POLICY_NAMES)}") from None
