"""Routing a request whose ``model`` is a LoRA adapter (docs/lora.md).

Discovery serves an adapter under its own name by the workers whose cards hold it, so the router's
candidates for it are those workers already. What this adds:

- the adapter limit: a worker runs at most ``max_loras`` distinct adapters at once (vLLM's
  ``--max-loras``: the adapters one engine step batches). A worker whose requests already use that
  many other adapters cannot take this one now; the router counts each worker's running adapters from
  its own bookings (and its replicas', which it hears the same way);
- runtime loading: when no worker holding the adapter can take the request (busy, or out of adapter
  slots), the least-loaded worker of the base model that loads adapters at runtime gets it, and loads
  it (the request carries the adapter's path); its card then lists the adapter like any other holder's;
- otherwise the request is ``Overloaded``: it waits in the router's queue (``--queue-timeout-s``) or is
  a 503 with Retry-After.

``decisions`` counts where adapter requests went (``meshfront_router_lora_requests_total``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from services.common.discovery import WorkerCard, adapter_of
from services.common.errors import Overloaded
from services.router.core.lifecycle import BOOK, FREE, LifecycleEvent
from services.router.core.types import Candidate

HELD, RUNTIME_LOAD = "held", "runtime_load"
WorkerLookup = Callable[[str], Sequence[WorkerCard]]
Admit = Callable[[list[Candidate]], list[Candidate]]


class AdapterRouting:
    """The adapter limit and runtime loading; a lifecycle listener of the router (after its policy)."""

    def __init__(self, workers_for: WorkerLookup):
        self._workers_for = workers_for
        # worker id -> adapter -> requests booked under it there; request id -> (worker id, adapter).
        self._running: dict[str, collections.Counter[str]] = {}
        self._requests: dict[str, tuple[str, str]] = {}
        self.decisions: dict[tuple[str, str], int] = {}  # (adapter, HELD | RUNTIME_LOAD) -> requests

    def base_of(self, model: str) -> str | None:
        """The base model of the adapter ``model`` names; None when ``model`` is no adapter."""
        cards = self._workers_for(model)
        return cards[0].model.name if adapter_of(model, cards) is not None else None

    def has_slot(self, card: WorkerCard, adapter: str, target: Candidate) -> bool:
        """``target``: the worker, or one data-parallel rank of it (each rank's engine has its own slots)."""
        running = self._running.get(target.worker_id)
        return not running or adapter in running or len(running) < card.max_loras

    def admissible(self, adapter: str, base: str, holders: list[Candidate], admit: Admit,
                   candidates_of: Callable[[str], list[Candidate]]) -> list[Candidate]:
        """The workers that may take a request for ``adapter`` now (``admit`` drops busy ones, raising
        Overloaded when none is left); raises Overloaded when no worker can."""
        cards = {c.worker_id: c for c in self._workers_for(base)}
        cards.update((c.worker_id, c) for c in self._workers_for(adapter))
        with_slot = [c for c in holders if c.instance in cards and self.has_slot(cards[c.instance], adapter, c)]
        busy: Overloaded | None = None
        if with_slot:
            try:
                return self._count(adapter, HELD, admit(with_slot))
            except Overloaded as e:
                busy = e
        held = {c.worker_id for c in holders}
        loaders = [c for c in candidates_of(base) if c.worker_id not in held and c.role != "prefill"
                   and cards[c.instance].lora_runtime_loading and self.has_slot(cards[c.instance], adapter, c)]
        if loaders:
            free = admit(loaders)
            chosen = min(free, key=lambda c: (c.in_flight, c.booked_prompt_tokens, c.worker_id))
            return self._count(adapter, RUNTIME_LOAD, [chosen])
        if busy is not None:
            raise busy
        raise Overloaded(f"Every worker holding the LoRA adapter `{adapter}` runs as many adapters as it may at "
                         "once (max_loras); retry later.", code="overloaded")

    def _count(self, adapter: str, placement: str, candidates: list[Candidate]) -> list[Candidate]:
        key = (adapter, placement)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        return candidates

    # -- lifecycle: which adapters each worker runs --------------------------------------------------

    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        if event.kind == BOOK:
            self._free(event.request_id)  # routed again (a migration): the old booking is over
            if self.base_of(event.model) is not None:
                self._requests[event.request_id] = (event.worker_id, event.model)
                self._running.setdefault(event.worker_id, collections.Counter())[event.model] += 1
        elif event.kind == FREE:
            self._free(event.request_id)

    def _free(self, request_id: str) -> None:
        booked = self._requests.pop(request_id, None)
        if booked is None:
            return
        worker_id, adapter = booked
        running = self._running.get(worker_id)
        if running is None:
            return
        running[adapter] -= 1
        if running[adapter] <= 0:
            del running[adapter]
        if not running:
            del self._running[worker_id]

    def drop_worker(self, worker_id: str) -> None:
        self._running.pop(worker_id, None)
        for request_id in [r for r, (w, _) in self._requests.items() if w == worker_id]:
            del self._requests[request_id]
