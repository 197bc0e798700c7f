"""Requests waiting for a busy model, served as workers free up: weighted fair between policy classes, fair
between tenants within a class, and in the class's queue policy within a tenant.

With ``--queue-timeout-s`` above 0 (or ``--router-queue-threshold``), a request that finds every worker of its
model busy, or others already waiting, waits here instead of failing at once with 503, for at most that long.
Whenever a booking ends (or a worker joins), the router routes waiters from the head while a worker is free;
routing the head books its worker, so a later arrival cannot take the slot a waiter was woken for.

Who is the head is decided at three levels, each cheap (no loop per token or per round):

1. Classes (core/policy_classes.py) by start-time fair queueing, the virtual-time form of Dynamo's weighted
   deficit round robin: each request costs its uncached prompt tokens (at least 1, Dynamo's scheduling cost);
   a class's next request starts at its previous one's finish, or at the current virtual time if the class
   was idle (no credit saved up while idle); it finishes ``cost / weight`` later. The smallest start goes
   first, so two classes that both wait are served tokens in the ratio of their weights, and a class that
   arrives is served at once after the request in service, whatever the others' backlog.
2. Tenants within a class (``RouteRequest.tenant``; a tenant's batch lines are a flow of their own) by the
   same rule with equal weights: a tenant flooding 48 streams and one sending 2 alternate, so the second's
   request waits for one slot, not for the flood.
3. Within one tenant, the class's queue policy: fcfs orders by arrival, a request's
   ``nvext.agent_hints.priority`` (seconds, negatives count as 0) moving it ahead as if it had arrived that
   much earlier; wspt by Dynamo's weighted shortest processing time (Smith's rule), the highest
   ``(1 + priority) / new prefill tokens`` first (lib/kv-router/src/scheduling/policy.rs).

Picking the head scans the waiting classes and their waiting tenants: both are bounded by the classes
declared and the keys issued, not by the requests waiting.
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
from services.router.core.policy_classes import FCFS, QUEUE_POLICIES, WSPT, PolicyClass, PolicyClasses

__all__ = ["FCFS", "QUEUE_POLICIES", "WSPT", "WaitQueue"]

R = TypeVar("R")


@dataclasses.dataclass(order=True)
class _Waiter:
    key: float  # fcfs: arrival time minus the priority jump; wspt: -(1 + jump) / new tokens. Smaller goes first
    seq: int
    request: Any = dataclasses.field(compare=False)
    future: asyncio.Future = dataclasses.field(compare=False)
    cost: int = dataclasses.field(compare=False, default=1)  # uncached prompt tokens, at least 1


@dataclasses.dataclass
class _Flow:
    """One tenant's waiters in one class (its batch lines are another flow)."""

    heap: list[_Waiter] = dataclasses.field(default_factory=list)
    finish: float = 0.0  # virtual finish of its last request served: its next one's start

    def head(self) -> _Waiter | None:
        """The first live waiter (abandoned ones, whose client timed out or left, are dropped)."""
        while self.heap and self.heap[0].future.done():
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


@dataclasses.dataclass
class _Class:
    spec: PolicyClass
    order: int  # declared place: breaks ties between equal starts
    flows: dict[str, _Flow] = dataclasses.field(default_factory=dict)
    finish: float = 0.0
    vtime: float = 0.0  # the start of its tenant flow served last

    def head(self) -> tuple[_Flow, _Waiter] | None:
        """The flow with the smallest start among those with a live waiter, and that waiter."""
        best: tuple[float, int, _Flow, _Waiter] | None = None
        for flow in self.flows.values():
            waiter = flow.head()
            if waiter is not None and (best is None or (flow.finish, waiter.seq) < best[:2]):
                best = (flow.finish, waiter.seq, flow, waiter)
        return None if best is None else (best[2], best[3])


@dataclasses.dataclass
class _Model:
    classes: dict[str, _Class] = dataclasses.field(default_factory=dict)
    vtime: float = 0.0  # the start of the class served last


class WaitQueue(Generic[R]):
    """``classes``: the router's policy classes (core/policy_classes.py); without them one class in ``policy``
    order, as without ``--router-policy-config``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, policy: str = FCFS,
                 classes: PolicyClasses | None = None):
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"queue policy {policy!r} is not one of {', '.join(QUEUE_POLICIES)}")
        self.classes = classes or PolicyClasses.synthetic(policy)
        self._order = {c.name: i for i, c in enumerate(self.classes.classes)}
        self._clock = clock
        self._models: dict[str, _Model] = {}
        self._seq = itertools.count()

    @property
    def reads_cost(self) -> bool:
        """Whether a request's uncached prompt tokens decide anything here (wspt, or classes to weigh)."""
        return len(self.classes.classes) > 1 or any(c.queue_policy == WSPT for c in self.classes.classes)

    def waiting(self, model: str) -> int:
        """Requests still waiting for ``model`` (abandoned ones not counted)."""
        m = self._models.get(model)
        if m is None:
            return 0
        return sum(1 for c in m.classes.values() for f in c.flows.values() for w in f.heap if not w.future.done())

    def models(self) -> list[str]:
        return [name for name, m in self._models.items()
                if any(f.heap for c in m.classes.values() for f in c.flows.values())]

    def depths(self) -> dict[str, int]:
        """Waiting requests per model (for the queued_requests gauge)."""
        return {m: self.waiting(m) for m in self.models()}

    def push(self, model: str, request: Any, priority_jump_s: float = 0.0, new_tokens: int = 0, *,
             policy_class: str = "", tenant: str = "", batch: bool = False) -> asyncio.Future:
        """Queues ``request``; the future gets what ``drain``'s ``route`` returned for it, or its error.
        ``new_tokens``: the prefill it would compute (its cost, and wspt's processing time). ``policy_class``:
        the class it asks for (policy_classes.resolve); ``tenant``: whose request it is; ``batch``: a batch line
        (the lowest class, a flow of its tenant's own)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        spec = self.classes.resolve(policy_class, batch)
        m = self._models.setdefault(model, _Model())
        cls = m.classes.get(spec.name)
        if cls is None:
            cls = m.classes[spec.name] = _Class(spec, self._order[spec.name])
        if cls.head() is None:  # idle until now: starts at the current virtual time, no credit saved up
            cls.finish = max(cls.finish, m.vtime)
        flow_id = f"{tenant}\0batch" if batch else tenant
        flow = cls.flows.get(flow_id)
        if flow is None:
            flow = cls.flows[flow_id] = _Flow()
        if flow.head() is None:
            flow.finish = max(flow.finish, cls.vtime)
        jump = max(priority_jump_s, 0.0)
        key = -(1.0 + jump) / max(1, new_tokens) if spec.queue_policy == WSPT else self._clock() - jump
        heapq.heappush(flow.heap, _Waiter(key, next(self._seq), request, future, max(1, new_tokens)))
        return future

    def _head(self, m: _Model) -> tuple[_Class, _Flow, _Waiter] | None:
        best: tuple[float, int, _Class, _Flow, _Waiter] | None = None
        for cls in m.classes.values():
            found = cls.head()
            if found is not None and (best is None or (cls.finish, cls.order) < best[:2]):
                best = (cls.finish, cls.order, cls, *found)
        return None if best is None else best[2:]

    def drain(self, model: str, route: Callable[[Any], R]) -> int:
        """Routes waiters from the head until one finds every worker busy; returns how many left."""
        m = self._models.get(model)
        served = 0
        while m is not None:
            head = self._head(m)
            if head is None:
                break
            cls, flow, waiter = head
            try:
                result = route(waiter.request)
            except Overloaded:
                break
            except MeshError as e:  # the model or its last worker went away meanwhile: no service given
                heapq.heappop(flow.heap)
                waiter.future.set_exception(e)
                continue
            heapq.heappop(flow.heap)
            waiter.future.set_result(result)
            served += 1
            # Virtual time moves to the served request's start; its class and flow to where it finishes.
            m.vtime, cls.finish = cls.finish, cls.finish + waiter.cost / cls.spec.weight
            cls.vtime, flow.finish = flow.finish, flow.finish + waiter.cost
        if m is not None and self._head(m) is None:
            del self._models[model]  # nobody waits: the next arrivals start afresh
        return served
