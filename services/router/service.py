"""The router's request handling, transport-free so the gateway can also run it in-process."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meshfront.router.v1 import router_pb2
from services.common.discovery import WorkerCard
from services.common.errors import ModelNotFound, NoWorkers
from services.router.core.bookings import Bookings
from services.router.core.policies import Policy, make_policy
from services.router.core.policies.direct import Direct
from services.router.core.types import Candidate, RouteQuery

WorkerLookup = Callable[[str], Sequence[WorkerCard]]


class Router:
    """Chooses a worker per request with one policy and books it until release."""

    def __init__(self, workers_for: WorkerLookup, mode: str = "round-robin", policy: Policy | None = None):
        self._workers_for = workers_for
        self.mode = mode
        self._policy = policy or make_policy(mode)
        self._direct = Direct()
        self.bookings = Bookings()

    def on_worker_change(self, worker_id: str, card: WorkerCard | None) -> None:
        if card is None:
            self.bookings.drop_worker(worker_id)

    def _candidates(self, model: str) -> list[Candidate]:
        cards = self._workers_for(model)
        if not cards:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return [Candidate(c.worker_id, c.address, self.bookings.in_flight(c.worker_id),
                          self.bookings.prompt_tokens(c.worker_id)) for c in cards]

    async def route(self, req: router_pb2.RouteRequest) -> router_pb2.RouteResponse:
        candidates = self._candidates(req.model)
        query = RouteQuery(req.request_id, req.model, tuple(req.block_hashes), req.prompt_tokens, req.worker_id)
        # A pin wins in every mode (as in Dynamo); 'direct' only differs in requiring one.
        policy = self._direct if req.worker_id else self._policy
        decision = policy.choose(candidates, query)
        chosen = next((c for c in candidates if c.worker_id == decision.worker_id), None)
        if chosen is None:
            raise NoWorkers(f"routing policy chose unknown worker {decision.worker_id}")
        self.bookings.book(req.request_id, chosen.worker_id, req.prompt_tokens)
        return router_pb2.RouteResponse(worker_id=chosen.worker_id, address=chosen.address,
                                        overlap_blocks=decision.overlap_blocks)

    async def release(self, req: router_pb2.ReleaseRequest) -> router_pb2.ReleaseResponse:
        self.bookings.release(req.request_id)
        return router_pb2.ReleaseResponse()
