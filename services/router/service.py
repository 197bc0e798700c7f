"""The router's request handling, transport-free so the gateway can also run it in-process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from meshfront.router.v1 import router_pb2

from services.common import debug_perf, tracing
from services.common.decision_record import (
    BY_DECODE_LOAD,
    BY_PIN,
    BY_POLICY,
    BY_SESSION,
    CandidateScore,
    DecisionRecord,
)
from services.common.discovery import PREFILL, WorkerCard
from services.common.dp_ranks import split_target
from services.common.errors import ModelNotFound, NoWorkers, Overloaded
from services.common.overload import BusyThreshold
from services.router.core.bookings import Bookings
from services.router.core.conditional import DisaggSettings
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, FREE, LifecycleEvent, LifecycleListener
from services.router.core.load_model import LoadThresholds, Saturated, WorkerLoads
from services.router.core.policies import DEFAULT_MODE, Policy, build_policy, policy_name
from services.router.core.policies.kv_aware import KvAware
from services.router.core.sessions import SessionAffinity
from services.router.core.types import Candidate, Decision, RouteQuery
from services.router.core.wait_queue import WaitQueue
from services.router.core.worker_gate import WorkerGate
from services.router.disagg import Disagg, Shape, check_pins, is_prefill_leg, prefill_leg_id
from services.router.dp_pins import answer, candidates_of, name_target, narrow_to_ranks, targets_of
from services.router.lora import AdapterRouting
from services.router.route_trace import route_attributes

log = logging.getLogger(__name__)
WorkerLookup = Callable[[str], Sequence[WorkerCard]]


class Router:
    """Chooses a worker per request with one policy and books it until release.

    ``policy`` comes from ``build_policy`` (round-robin when not given). ``kv``: the kv policy, when it is
    the one choosing (assembly.py ``kv_router`` passes it as both): its view of the workers' caches and load
    weighs the disaggregated pair, fills the explain view, and makes the router ask for first-token reports
    (the first token ends a request's prefill load there). It hears the lifecycle as a listener.
    """

    def __init__(self, workers_for: WorkerLookup, policy: Policy | None = None,
                 busy: BusyThreshold | None = None, queue_timeout_s: float = 0.0,
                 disagg: DisaggSettings | None = None, kv: KvAware | None = None):
        self._workers_for = workers_for
        self.policy = policy or build_policy(DEFAULT_MODE)
        self.kv = kv
        self._pinned = build_policy("direct")
        self.bookings = Bookings()
        self.busy = busy or BusyThreshold()
        # Which requests run as a prefill and a decode leg, on which pair (disagg.py).
        self.disagg = Disagg(disagg or DisaggSettings(), kv, self.busy)
        # Who hears every booking change (core/lifecycle.py), in order. LoRA adapters: the workers' adapter
        # limit and runtime loading (lora.py) count bookings. The assembly subscribes the others: the kv policy
        # first (its per-request load beside the bookings), then the metrics and the replica sync.
        self.lora = AdapterRouting(workers_for)
        self.listeners: list[LifecycleListener] = [self.lora]
        # Dynamo's load thresholds (core/load_model.py) weigh each worker's prefill tokens and decode blocks,
        # which their WorkerLoads keeps from the same lifecycle.
        self.loads: WorkerLoads | None = self.busy.loads if isinstance(self.busy, LoadThresholds) \
            and self.busy.reads_loads else None
        if self.loads is not None:
            self.listeners.append(self.loads)
        self.sessions = SessionAffinity()
        # Requests waiting for a busy model (0: none wait; every worker busy fails at once with 503).
        self.queue_timeout_s = queue_timeout_s
        self.queue: WaitQueue[router_pb2.RouteResponse] = WaitQueue()
        # Router replicas share every booking when a decision here weighs what is booked (see _replicates).
        self.shares_load = self.policy.reads_load or self.busy.enabled
        # --router-min-initial-workers: Route calls wait until that many workers registered (core/worker_gate.py);
        # open unless the assembly sets one up.
        self.gate = WorkerGate()
        # Each worker's routing targets (its data-parallel ranks' target ids, or its own id: dp_pins.py), as its
        # last card declared them: what to forget when it leaves.
        self._targets: dict[str, list[str]] = {}

    def on_worker_change(self, worker_id: str, card: WorkerCard | None) -> None:
        self.gate.on_worker_change(worker_id, card is not None)
        gone = self._targets.pop(worker_id, [worker_id] if card is None else [])
        if card is not None:
            self._targets[worker_id] = targets_of(card)
            gone = [t for t in gone if t not in self._targets[worker_id]]  # ranks a new card no longer declares
        for target in gone:
            self.bookings.drop_worker(target)
            self.sessions.drop_worker(target)
            if self.kv is not None:
                self.kv.drop_worker(target)
            self.lora.drop_worker(target)
        self._drain_queue()  # a new worker is free capacity; a gone one may fail its waiters

    def _candidates(self, model: str) -> list[Candidate]:
        cards = self._workers_for(model)
        if not cards:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return self._as_candidates(cards)

    def _as_candidates(self, cards: Sequence[WorkerCard]) -> list[Candidate]:
        return candidates_of(cards, self.bookings)

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        if not self.gate.is_open:  # still starting: too few workers registered to route on yet
            await self.gate.wait()
        if debug_perf.ENABLED:  # its line: the choice's wall and CPU (services/common/debug_perf.py)
            with debug_perf.request("route", req.request_id) as perf, perf.section("route"):
                return await self._traced(req)
        return await self._traced(req)

    async def _traced(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        if not tracing.ENABLED:
            return await self._route(req)
        with tracing.span("route", {"meshfront.model": req.model,
                                    "meshfront.prompt_tokens": req.prompt_tokens}) as span:
            response = await self._route(req)
            span.set_attributes(route_attributes(response))
            return response

    async def _route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        # Earlier requests' first tokens and endings come first: they free what this one may take.
        self._apply_reports(req.first_tokens, req.releases)
        saturates = isinstance(self.busy, LoadThresholds) and self.busy.queue_threshold is not None
        if self.queue_timeout_s <= 0 and not saturates:
            return self._route_now(req)
        if not self.queue.waiting(req.model):
            try:
                return self._route_now(req)
            except Saturated:
                pass  # --router-queue-threshold: every worker's prefill is full, wait for one to drain
            except Overloaded:
                if self.queue_timeout_s <= 0:
                    raise
        else:  # a wrong pin is the client's mistake now (a 400), not after a wait that may end in a 503
            every = self._candidates(req.model)
            check_pins(req, every)
            narrow_to_ranks(req, every)
        # Every worker is busy, or others wait already: queue up (priority decides who goes first).
        return await self._wait(req)

    async def _wait(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        future = self.queue.push(req.model, req, req.priority_jump_s, self._new_tokens(req),
                                 policy_class=req.policy_class, tenant=req.tenant, batch=req.batch)
        depth = self.queue.waiting(req.model)
        with tracing.span("route.queue_wait", {"meshfront.queue_depth": depth}):
            return await self._waited(req, future, depth)

    async def _waited(self, req: router_pb2.RouteRequest, future: asyncio.Future, depth: int
                      ) -> router_pb2.RouteResponse:
        try:
            # No --queue-timeout-s: a request held by --router-queue-threshold waits as long as its client does.
            async with asyncio.timeout(self.queue_timeout_s or None):
                response = await future
        except (TimeoutError, asyncio.CancelledError) as e:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.apply(LifecycleEvent(FREE, req.request_id))  # routed just as its caller gave up
            if isinstance(e, TimeoutError):
                raise Overloaded(f"Every worker serving `{req.model}` stayed busy for {self.queue_timeout_s:g} s; "
                                 "retry later.", code="overloaded") from None
            raise
        response.queue_depth = depth
        return response

    def _new_tokens(self, req: router_pb2.RouteRequest) -> int:
        """The prefill ``req`` computes at best (its cost between classes, wspt's processing time): its prompt
        less the most any worker caches of it, as the kv policy sees the caches (the whole prompt elsewhere)."""
        if not self.queue.reads_cost or self.kv is None or not req.block_hashes:
            return req.prompt_tokens
        cards = self._workers_for(req.model)
        block_size = cards[0].model.block_size if cards else 16
        return req.prompt_tokens - max(self.kv.overlaps(req.block_hashes).values(), default=0) * block_size

    def _drain_queue(self) -> None:
        for model in self.queue.models():
            self.queue.drain(model, self._route_now)

    def _route_now(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        """Chooses and books a worker (or a prefill and a decode worker) now, or raises (Overloaded when
        every worker is busy)."""
        every = self._candidates(req.model)
        # Against every worker, before busy ones drop out: a wrong pin is a 400. A pinned worker that failed
        # this request (migration) may have left: that is a 503 from Direct, not the client's mistake.
        check_pins(req, every)
        every = narrow_to_ranks(req, every)  # data-parallel rank pins (dp_pins.py)
        serving = [c for c in every if c.role != PREFILL]  # those that decode: decode and both workers
        if not serving:
            raise NoWorkers(f"No worker that decodes serves `{req.model}`: only prefill workers do.")
        base = self.lora.base_of(req.model)
        if base is None:
            candidates = self._admissible(serving, req)
        else:  # a LoRA adapter: its holders within their adapter limit, or a worker that loads it now
            candidates = self.lora.admissible(req.model, base, serving, lambda cs: self._admissible(cs, req),
                                              lambda name: self._as_candidates(self._workers_for(name)))
        decode_pin = req.decode_worker_id or req.worker_id
        query = RouteQuery(req.request_id, req.model, tuple(req.block_hashes), req.prompt_tokens, decode_pin,
                           req.explain)
        decision, chosen_by = self._choose(req, query, serving, candidates, self.disagg.plain_decode(every, req))
        chosen = next((c for c in candidates if c.worker_id == decision.worker_id), None)
        if chosen is None:
            raise NoWorkers(f"routing policy chose unknown worker {decision.worker_id}")
        shape = self.disagg.shape(req, every, chosen, decision.overlap_blocks)
        predicted = self._book(req, query, shape, self._replicates(req, every, base is not None))
        response = router_pb2.RouteResponse(address=chosen.address, overlap_blocks=shape.decode_overlap,
                                            report_first_token=self.kv is not None,
                                            reads_first_token_reports=True, disaggregation_reason=shape.reason)
        answer(response, chosen, shape.prefill)  # worker ids, and their ranks beside them
        if shape.prefill is not None:
            response.prefill_address = shape.prefill.address
            response.prefill_overlap_blocks = shape.prefill_overlap
            response.report_first_token = True  # the first token ends the prefill leg's booking
        if req.explain:
            record = DecisionRecord(policy_name(self.policy), chosen_by, chosen.instance,
                                    decision.scores or self._booked_view(candidates, query),
                                    predicted, req.prompt_tokens, response.prefill_worker_id)
            response.decision.CopyFrom(decision_proto(record))
        if self.loads is not None:  # the first token ends the request's prefill tokens (core/load_model.py)
            response.report_first_token = True
        return response

    def _choose(self, req: router_pb2.RouteRequest, query: RouteQuery, serving: list[Candidate],
                candidates: list[Candidate], plain_decode: bool) -> tuple[Decision, str]:
        """The (decode) worker: the pinned one, the session's, or the policy's (decode load alone when the
        request will be split unconditionally: see Disagg.plain_decode), and which of them chose it."""
        pin = query.pinned_worker_id
        session, _ = self.sessions.key(req.session_id, req.affinity_session_id, req.session_timeout_s)
        sticky = self.sessions.worker_for(session) if session and not pin else None
        if sticky is not None and self.sessions.hard and split_target(sticky)[0] not in req.exclude_worker_ids \
                and all(c.worker_id != sticky for c in candidates) and any(c.worker_id == sticky for c in serving):
            # Hard affinity and the session's worker is busy: wait for it in the queue (its KV holds the
            # session), or a 503 without one. Soft affinity lets the policy choose below (core/sessions.py).
            raise Overloaded(f"The worker of session {session!r} is busy.", code="overloaded")
        if sticky is not None and any(c.worker_id == sticky for c in candidates):
            return Decision(sticky), BY_SESSION
        if pin:  # a pin wins in every mode (as in Dynamo); 'direct' only differs in requiring one
            return self._pinned.choose(candidates, query), BY_PIN
        if plain_decode:
            return Decision(self.disagg.least_decode_load(candidates).worker_id), BY_DECODE_LOAD
        return self.policy.choose(candidates, query), BY_POLICY

    def _booked_view(self, candidates: list[Candidate], query: RouteQuery) -> tuple[CandidateScore, ...]:
        """Each candidate as the router saw it when the policy kept no view of its own (it scores nothing, or a
        pin or session chose): the bookings, and the overlap the kv policy expects, else 0."""
        overlaps = self.kv.overlaps(query.block_hashes) if self.kv is not None else {}
        return tuple(CandidateScore(c.worker_id, overlaps.get(c.worker_id, 0), c.in_flight, c.booked_prompt_tokens)
                     for c in candidates)

    def _replicates(self, req: router_pb2.RouteRequest, every: Sequence[Candidate], adapter: bool) -> bool:
        """Whether the other router replicas need this booking (ReplicaSync publishes only those: each costs
        every replica a decode and an apply). They do when their decisions weigh load (a load-reading policy,
        the busy threshold, a model with prefill workers), or read this request's state (a session's binding,
        an adapter's slot), and for a migration: the postprocessor's Route may land on another replica than
        the one that first booked the request, where the gateway's release goes."""
        session, _ = self.sessions.key(req.session_id, req.affinity_session_id, req.session_timeout_s)
        return (self.shares_load or bool(session) or adapter or bool(req.exclude_worker_ids)
                or any(c.role == PREFILL for c in every))

    def _book(self, req: router_pb2.RouteRequest, query: RouteQuery, shape: Shape, replicate: bool) -> int:
        """Books the request on its worker, and a split request's prefill leg on its prefill worker; returns the
        cached prompt tokens predicted (those the first-token report will measure)."""
        leg = prefill_leg_id(req.request_id)
        if leg in self.bookings:  # routed again (a migration): the old pair's prefill leg is over
            self.apply(LifecycleEvent(FREE, leg))
        decode, prefill, prompt = shape.decode, shape.prefill, req.prompt_tokens
        session, timeout_s = self.sessions.key(req.session_id, req.affinity_session_id, req.session_timeout_s)
        if prefill is None:
            overlap, predicted = shape.decode_overlap, min(prompt, shape.decode_overlap * decode.block_size)
        else:
            # The decode worker receives the whole prompt by transfer: no prefill load there. The first-token
            # report (the prefill leg's) measures the prefill worker's cache: the prediction it scores is that one.
            overlap, predicted = len(query.block_hashes), min(prompt, shape.prefill_overlap * prefill.block_size)
        self.apply(LifecycleEvent(BOOK, req.request_id, decode.worker_id, req.model, query.block_hashes, prompt,
                                  overlap, predicted, session_id=session, session_action=req.session_action,
                                  session_timeout_s=timeout_s, replicate=replicate))
        if prefill is not None:  # booked with the tokens it computes: the prefill queue others are weighed by
            self.apply(LifecycleEvent(BOOK, leg, prefill.worker_id, req.model, query.block_hashes,
                                      prompt - predicted, shape.prefill_overlap, predicted, replicate=replicate))
        return predicted

    def _admissible(self, candidates: list[Candidate], req: router_pb2.RouteRequest) -> list[Candidate]:
        """Drops workers a migrating request already failed on, then busy ones (Overloaded if none is left)."""
        if req.exclude_worker_ids:
            excluded = set(req.exclude_worker_ids)
            candidates = [c for c in candidates if c.instance not in excluded]  # every rank of such a worker
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
        if event.kind != BOOK and not is_prefill_leg(event.request_id):
            leg = prefill_leg_id(event.request_id)
            if leg in self.bookings:  # a split request's first token or end: its prefill leg is over
                self.apply(LifecycleEvent(FREE, leg), remote)
        # (and with load thresholds a first token too: it ends a prefill, room under the prefill thresholds)
        if event.kind == FREE or (event.kind == FIRST_TOKEN and self.loads is not None):
            self._drain_queue()  # a worker may have room for whoever waits longest (or most urgently)


def decision_proto(record: DecisionRecord) -> router_pb2.RoutingDecision:
    out = router_pb2.RoutingDecision(policy=record.policy, chosen_by=record.chosen_by, worker_id=record.worker_id,
                                     prefill_worker_id=record.prefill_worker_id,
                                     predicted_cached_tokens=record.predicted_cached_tokens,
                                     prompt_tokens=record.prompt_tokens)
    for c in record.candidates:
        score = out.candidates.add(overlap_blocks=c.overlap_blocks, in_flight=c.in_flight,
                                   booked_prompt_tokens=c.booked_prompt_tokens, eligible=c.eligible)
        name_target(c.worker_id, score)  # a rank's target id as its worker and rank
        if c.active_blocks is not None:
            score.active_blocks = c.active_blocks
        if c.score is not None:
            score.score = c.score
    return out
