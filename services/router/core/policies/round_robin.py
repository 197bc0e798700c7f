"""round-robin: a counter modulo the live candidates (sorted by id, so replicas agree on order).

Parameters: none. Optimises: even request counts when requests are alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from services.router.core.types import Candidate, Decision, RouteQuery


class RoundRobin:
    reads_load = False

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        ordered = sorted(candidates, key=lambda c: c.worker_id)
        return Decision(ordered[next(self._counter) % len(ordered)].worker_id)
