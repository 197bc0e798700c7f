"""Routing policies: one file each, one narrow interface, a registry by kebab-case name.

A policy gets the live candidates for a model (never empty) and the query, and
returns a Decision. State a policy needs lives in its own instance (a counter,
an RNG); load lives in the candidates it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from services.router.core.types import Candidate, Decision, RouteQuery


class Policy(Protocol):
    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision: ...


def _registry() -> dict[str, Callable[..., Policy]]:
    from services.router.core.policies.direct import Direct
    from services.router.core.policies.least_loaded import LeastLoaded
    from services.router.core.policies.random_choice import RandomChoice
    from services.router.core.policies.round_robin import RoundRobin

    return {"round-robin": RoundRobin, "random": RandomChoice, "least-loaded": LeastLoaded, "direct": Direct}


POLICY_NAMES = ("round-robin", "random", "least-loaded", "direct")


def make_policy(name: str, **kwargs) -> Policy:
    try:
        return _registry()[name](**kwargs)
    except KeyError:
        raise ValueError(f"unknown router mode {name!r}; choose one of {', '.join(POLICY_NAMES)}") from None
