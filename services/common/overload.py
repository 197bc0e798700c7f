"""Busy thresholds: when a worker counts as busy, and what the mesh says when all of them are.

Dynamo marks a worker busy from its reported load and, when every worker of a model is busy, fails
the request at once with 503 instead of letting queues grow without bound (dynamo-frontend.md §5.2).
Here the router applies ``BusyThreshold`` to the in-flight requests it booked on each worker, and a
worker bounds its own waiting queue (the mocker's ``--max-waiting``: the hard cap, which holds
whatever the routers believe). Both raise ``Overloaded``: RESOURCE_EXHAUSTED on gRPC, 503 with ``Retry-After``
at the HTTP edge.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from services.common.errors import Overloaded

T = TypeVar("T")

# Seconds a rejected client is told to wait (the Retry-After header).
RETRY_AFTER_S = 1


@dataclasses.dataclass(frozen=True)
class BusyThreshold:
    """A worker with ``max_in_flight`` or more requests in flight is busy; 0 disables the check."""

    max_in_flight: int = 0

    @property
    def enabled(self) -> bool:
        return self.max_in_flight > 0

    def is_busy(self, in_flight: int) -> bool:
        return self.enabled and in_flight >= self.max_in_flight

    def available(self, workers: Sequence[T], in_flight: Callable[[T], int], model: str) -> list[T]:
        """The workers that are not busy.

        Raises:
            Overloaded: every worker is busy.
        """
        if not self.enabled:
            return list(workers)
        free = [w for w in workers if not self.is_busy(in_flight(w))]
        if not free:
            raise Overloaded(f"Every worker serving `{model}` is busy; retry in {RETRY_AFTER_S} s.",
                             code="overloaded")
        return free
