"""The router's request handling, transport-free so the gateway can also run it in-process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from meshfront.router.v1 import router_pb2

from services.common.discovery import WorkerCard
from services.common.errors import ModelNotFound, NoWorkers, Overloaded
from services.common.overload import BusyThreshold
from services.router.core.bookings import Bookings
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, FREE, LifecycleEvent, LifecycleListener
from services.router.core.policies import DEFAULT_MODE, Policy, build_policy
from services.router.core.sessions import SessionAffinity
from services.router.core.types import Candidate, Decision, RouteQuery
from services.router.core.wait_queue import WaitQueue

log = logging.getLogger(__name__)
WorkerLookup = Callable[[str], Sequence[WorkerCard]]


class Router:
    """Chooses a worker per request with one policy and books it until release.

    ``policy`` comes from ``build_policy`` (round-robin when not given).
    """

    def __init__(self, workers_for: WorkerLookup, policy: Policy | None = None,
                 busy: BusyThreshold | None = None, queue_timeout_s: float = 0.0):
        self._workers_for = workers_for
        self.policy = policy or build_policy(DEFAULT_MODE)
        self._pinned = build_policy("direct")
        self.bookings = Bookings()
        self.busy = busy or BusyThreshold()
        # The policy hears every booking change first (kv keeps per-request load beside the bookings);
        # then the metrics and the replica sync, which the assembly appends. See core/lifecycle.py.
        self.listeners: list[LifecycleListener] = [self.policy]
        self.sessions = SessionAffinity()
        # Requests waiting for a busy model (0: none wait; every worker busy fails at once with 503).
        self.queue_timeout_s = queue_timeout_s
        self.queue: WaitQueue[router_pb2.RouteResponse] = WaitQueue()

    def on_worker_change(self, worker_id: str, card: WorkerCard | None) -> None:
        if card is None:
            self.bookings.drop_worker(worker_id)
            self.sessions.drop_worker(worker_id)
            self.policy.drop_worker(worker_id)
        self._drain_queue()  # a new worker is free capacity; a gone one may fail its waiters

    def _candidates(self, model: str) -> list[Candidate]:
        cards = self._workers_for(model)
        if not cards:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return [Candidate(c.worker_id, c.address, self.bookings.in_flight(c.worker_id),
                          self.bookings.prompt_tokens(c.worker_id)) for c in cards]

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        # Earlier requests' first tokens and endings come first: they free what this one may take.
        self._apply_reports(req.first_tokens, req.releases)
        if self.queue_timeout_s <= 0:
            return self._route_now(req)
        if not self.queue.waiting(req.model):
            try:
                return self._route_now(req)
            except Overloaded:
                pass
        # Every worker is busy, or others wait already: queue up (priority decides who goes first).
        return await self._wait(req)

    async def _wait(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        future = self.queue.push(req.model, req, req.priority_jump_s)
        depth = self.queue.waiting(req.model)
        try:
            response = await asyncio.wait_for(future, self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.apply(LifecycleEvent(FREE, req.request_id))  # routed just as its caller gave up
            if isinstance(e, asyncio.TimeoutError):
                raise Overloaded(f"Every worker serving `{req.model}` stayed busy for {self.queue_timeout_s:g} s; "
                                 "retry later.", code="overloaded") from None
            raise
        response.queue_depth = depth
        return response

    def _drain_queue(self) -> None:
        for model in self.queue.models():
            self.queue.drain(model, self._route_now)

    def _route_now(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        """Chooses and books a worker now, or raises (Overloaded when every worker is busy)."""
        every = self._candidates(req.model)
        candidates = self._admissible(every, req)
        query = RouteQuery(req.request_id, req.model, tuple(req.block_hashes), req.prompt_tokens, req.worker_id)
        sticky = self.sessions.worker_for(req.session_id) if req.session_id and not req.worker_id else None
        if sticky is not None and self.queue_timeout_s > 0 and sticky not in req.exclude_worker_ids \
                and all(c.worker_id != sticky for c in candidates) and any(c.worker_id == sticky for c in every):
            # The session's worker is busy and requests may wait: wait for it (its KV holds the session).
            raise Overloaded(f"The worker of session {req.session_id!r} is busy.", code="overloaded")
        if sticky is not None and any(c.worker_id == sticky for c in candidates):
            decision = Decision(sticky)
        else:
            # A pin wins in every mode (as in Dynamo); 'direct' only differs in requiring one.
            policy = self._pinned if req.worker_id else self.policy
            decision = policy.choose(candidates, query)
        chosen = next((c for c in candidates if c.worker_id == decision.worker_id), None)
        if chosen is None:
            raise NoWorkers(f"routing policy chose unknown worker {decision.worker_id}")
        block_size = self._block_size(req.model, chosen.worker_id)
        self.apply(LifecycleEvent(BOOK, req.request_id, chosen.worker_id, req.model, query.block_hashes,
                                  req.prompt_tokens, decision.overlap_blocks,
                                  min(req.prompt_tokens, decision.overlap_blocks * block_size),
                                  session_id=req.session_id, session_action=req.session_action,
                                  session_timeout_s=req.session_timeout_s))
        return router_pb2.RouteResponse(worker_id=chosen.worker_id, address=chosen.address,
                                        overlap_blocks=decision.overlap_blocks,
                                        report_first_token=self.policy.wants_first_token,
                                        reads_first_token_reports=True)

    def _admissible(self, candidates: list[Candidate], req: router_pb2.RouteRequest) -> list[Candidate]:
        """Drops workers a migrating request already failed on, then busy ones (Overloaded if none is left)."""
        if req.exclude_worker_ids:
            excluded = set(req.exclude_worker_ids)
            candidates = [c for c in candidates if c.worker_id not in excluded]
            if not candidates:
                raise NoWorkers(f"No other worker serves `{req.model}`.")
        return self.busy.available(candidates, lambda c: c.in_flight, req.model)

    async def release(self, req: router_pb2.ReleaseRequest) -> router_pb2.ReleaseResponse:
        self._release(req)
        return router_pb2.ReleaseResponse()

    async def release_batch(self, req: router_pb2.ReleaseBatchRequest) -> router_pb2.ReleaseBatchResponse:
        self._apply_reports(req.first_tokens, req.releases)
        return router_pb2.ReleaseBatchResponse()

    def _apply_reports(self, first_tokens: Sequence[router_pb2.FirstTokenReport],
                       releases: Sequence[router_pb2.ReleaseRequest]) -> None:
        for report in first_tokens:  # before the releases: a request's first token precedes its end
            self.apply(LifecycleEvent(FIRST_TOKEN, report.request_id, prompt_tokens=report.prompt_tokens,
                                      cached_tokens=report.cached_tokens))
        for release in releases:
            self._release(release)

    def _release(self, req: router_pb2.ReleaseRequest) -> None:
        if req.first_token:  # deprecated form of a FirstTokenReport, from a gateway that predates it
            self.apply(LifecycleEvent(FIRST_TOKEN, req.request_id, prompt_tokens=req.prompt_tokens,
                                      cached_tokens=req.cached_tokens))
        else:
            self.apply(LifecycleEvent(FREE, req.request_id))

    def apply(self, event: LifecycleEvent, remote: bool = False) -> None:
        """One booking change, made here or (``remote``) by a replica (listeners are told which)."""
        if event.kind == BOOK:
            self.bookings.book(event.request_id, event.worker_id, event.prompt_tokens)
            if event.session_id:
                self.sessions.bind(event.session_id, event.worker_id, event.session_timeout_s)
                if event.session_action == "close":
                    self.sessions.close_after(event.request_id, event.session_id)
        elif event.kind == FREE:
            self.bookings.release(event.request_id)
            self.sessions.on_release(event.request_id)
        for listener in self.listeners:
            listener.on_lifecycle(event, remote)
        if event.kind == FREE:
            self._drain_queue()  # a worker may have room for whoever waits longest (or most urgently)

    def _block_size(self, model: str, worker_id: str) -> int:
        return next((c.model.block_size for c in self._workers_for(model) if c.worker_id == worker_id), 16)
