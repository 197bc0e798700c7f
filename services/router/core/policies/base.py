"""What every routing policy is to the router: a chooser.

A policy gets the live candidates for a model (never empty) and the query, and returns a ``Decision``.
It says whether that choice weighs the load booked on each worker (``reads_load``), because router
replicas then have to share every booking. That is all: a policy that needs more, such as the request
lifecycle (kv keeps each request's blocks and prefill load), subscribes to it like any other listener,
at assembly (services/router/assembly.py ``kv_router``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.router.core.types import Candidate, Decision, RouteQuery


class Policy(Protocol):
    # Whether ``choose`` weighs what is booked on each worker (the candidates' in_flight and booked tokens, or
    # load the policy tracks): router replicas must then share every booking (events.py ReplicaSync). Every
    # policy says so: a replica that skips a booking another needs routes on a wrong view of the load.
    reads_load: bool

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        """The worker for ``query`` among ``candidates`` (never empty)."""
