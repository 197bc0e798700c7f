"""least-loaded: the candidate with the fewest in-flight requests booked by this router.

Ties go to the fewest booked prompt tokens, then to a rotating pick so a burst
of simultaneous requests is spread instead of landing on the lowest id.
Parameters: none. Optimises: queueing delay when request costs are similar.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from services.router.core.types import Candidate, Decision, RouteQuery


class LeastLoaded:
    reads_load = True  # the bookings of every replica, so that two replicas do not fill the same worker

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        best = min((c.in_flight, c.booked_prompt_tokens) for c in candidates)
        tied = sorted((c for c in candidates if (c.in_flight, c.booked_prompt_tokens) == best),
                      key=lambda c: c.worker_id)
        return Decision(tied[next(self._counter) % len(tied)].worker_id)
