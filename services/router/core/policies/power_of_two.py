"""power-of-two: two candidates drawn at random, the one with fewer in-flight requests wins.

Dynamo's ``--router-mode power-of-two`` ("picks 2 random workers and routes to the one with fewer in-flight
requests"), the power of two choices (Mitzenmacher): nearly least-loaded's balance while reading the load
of two workers only, so replicas with slightly stale views do not all pile onto the one least-loaded worker.
Ties go to fewer booked prompt tokens, then to the first drawn. One candidate: it is chosen.

Parameters: ``rng`` (injected for tests). Optimises: queueing delay, robust to stale load.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.router.core.types import Candidate, Decision, RouteQuery


class PowerOfTwo:
    reads_load = True  # the bookings of every replica: the two draws compare them

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        if len(candidates) == 1:
            return Decision(candidates[0].worker_id)
        a, b = self._rng.sample(list(candidates), 2)
        pick = b if (b.in_flight, b.booked_prompt_tokens) < (a.in_flight, a.booked_prompt_tokens) else a
        return Decision(pick.worker_id)
