"""random: uniform choice among the live candidates.

Parameters: ``rng`` (injected for tests). Optimises: nothing; a baseline with no shared state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.router.core.types import Candidate, Decision, RouteQuery


class RandomChoice:
    reads_load = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        return Decision(self._rng.choice(list(candidates)).worker_id)
