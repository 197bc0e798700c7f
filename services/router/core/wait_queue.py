"""Requests waiting for a busy model, served in priority order as workers free up.

With ``--queue-timeout-s`` above 0, a request that finds every worker of its model busy waits here
instead of failing at once with 503, for at most that long. Order is Dynamo's: a request's
``nvext.agent_hints.priority`` (seconds, negatives count as 0) moves it ahead as if it had arrived
that much earlier; equal keys keep arrival order. ``--router-queue-policy wspt`` orders instead by Dynamo's
weighted shortest processing time (Smith's rule): the highest ``(1 + priority) / new prefill tokens`` first
(the prompt less the most any worker caches of it), which minimises the mean wait where fcfs bounds the
longest (lib/kv-router/src/scheduling/policy.rs). Whenever a booking ends (or a worker joins), the
router routes waiters from the head while a worker is free; routing the head of the queue books its
worker, so a later arrival cannot take the slot a waiter was woken for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from services.common.errors import MeshError, Overloaded

R = TypeVar("R")


@dataclasses.dataclass(order=True)
class _Waiter:
    key: float  # fcfs: arrival time minus the priority jump; wspt: -(1 + jump) / new tokens. Smaller goes first
    seq: int
    request: Any = dataclasses.field(compare=False)
    future: asyncio.Future = dataclasses.field(compare=False)


FCFS, WSPT = "fcfs", "wspt"
QUEUE_POLICIES = (FCFS, WSPT)


class WaitQueue(Generic[R]):
    def __init__(self, clock: Callable[[], float] = time.monotonic, policy: str = FCFS):
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"queue policy {policy!r} is not one of {', '.join(QUEUE_POLICIES)}")
        self.policy = policy
        self._clock = clock
        self._heaps: dict[str, list[_Waiter]] = {}
        self._seq = itertools.count()

    def waiting(self, model: str) -> int:
        """Requests still waiting for ``model`` (abandoned ones not counted)."""
        return sum(1 for w in self._heaps.get(model, ()) if not w.future.done())

    def models(self) -> list[str]:
        return [m for m, heap in self._heaps.items() if heap]

    def depths(self) -> dict[str, int]:
        """Waiting requests per model (for the queued_requests gauge)."""
        return {m: self.waiting(m) for m in self.models()}

    def push(self, model: str, request: Any, priority_jump_s: float = 0.0, new_tokens: int = 0) -> asyncio.Future:
        """Queues ``request``; the future gets what ``drain``'s ``route`` returned for it, or its error.
        ``new_tokens``: the prefill it would compute (only wspt reads it)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        jump = max(priority_jump_s, 0.0)
        key = -(1.0 + jump) / max(1, new_tokens) if self.policy == WSPT else self._clock() - jump
        heapq.heappush(self._heaps.setdefault(model, []), _Waiter(key, next(self._seq), request, future))
        return future

    def drain(self, model: str, route: Callable[[Any], R]) -> int:
        """Routes waiters from the head until one finds every worker busy; returns how many left."""
        heap = self._heaps.get(model)
        served = 0
        while heap:
            waiter = heap[0]
            if waiter.future.done():  # timed out or cancelled: its client is gone
                heapq.heappop(heap)
                continue
            try:
                result = route(waiter.request)
            except Overloaded:
                break
            except MeshError as e:  # the model or its last worker went away meanwhile
                heapq.heappop(heap)
                waiter.future.set_exception(e)
                continue
            heapq.heappop(heap)
            waiter.future.set_result(result)
            served += 1
        if heap is not None and not heap:
            del self._heaps[model]
        return served
