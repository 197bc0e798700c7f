"""Disaggregated prefill and decode in the router: the pools, the pins, the pair, and the reason.

A model's workers split by role (services/common/discovery.py): prefill workers run only prefill
legs; decode and ``both`` workers run decode legs and the requests kept aggregated. The router
chooses the decode worker first (service.py, as it always chose the one worker), then ``Disagg.shape``
decides whether a prefill worker runs the prompt first, and which:

- no prefill worker registered: aggregated, as before disaggregation existed (``--enforce-disagg``:
  a 503 instead);
- a prefill pin: split there; a worker pin alone (``backend_instance_id``): aggregated on it;
- otherwise the prefill worker with the fewest prefill tokens in front of this prompt (its uncached
  part there, by the kv policy's overlaps, plus the tokens already waiting there), then
  conditional disaggregation (core/conditional.py) may keep the request on its decode worker.

A split request is booked twice: its decode worker under its own id (the prompt arrives by
transfer: no prefill load there), its prefill leg under ``prefill_leg_id`` with its uncached tokens,
which the router frees at the first token (the prefill leg's) or at the release, whichever comes first.
Docs: docs/architecture.md, "Disaggregated prefill and decode".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from meshfront.router.v1 import router_pb2

from services.common.discovery import PREFILL
from services.common.errors import InvalidRequest, NoWorkers, Overloaded
from services.common.overload import BusyThreshold
from services.router.core.conditional import (
    AGGREGATED_REASONS,
    NO_PREFILL_WORKERS,
    PINNED_PREFILL,
    PINNED_WORKER,
    PREFILL_UNAVAILABLE,
    DisaggSettings,
    SplitInput,
    decide,
)
from services.router.core.policies.direct import PIN_PARAM, check_pin, printable
from services.router.core.policies.kv_aware import KvAware
from services.router.core.types import Candidate

PREFILL_PIN_PARAM = "nvext.prefill_worker_id"
DECODE_PIN_PARAM = "nvext.decode_worker_id"
_PREFILL_LEG = "#prefill"


def prefill_leg_id(request_id: str) -> str:
    """The booking of a split request's prefill leg (its decode worker's is under ``request_id``)."""
    return request_id + _PREFILL_LEG


def is_prefill_leg(booking_id: str) -> bool:
    return booking_id.endswith(_PREFILL_LEG)


@dataclasses.dataclass(frozen=True)
class Shape:
    """Where a request runs: aggregated on ``decode``, or split with its prefill leg on ``prefill``."""

    decode: Candidate
    decode_overlap: int  # leading prompt blocks the decode worker holds
    reason: str  # core/conditional.py REASONS
    prefill: Candidate | None = None
    prefill_overlap: int = 0


def check_pins(req: router_pb2.RouteRequest, every: Sequence[Candidate]) -> None:
    """A pin to a worker that does not serve the model, or to one of the wrong role, is the client's mistake:
    a 400 naming the field as ``'nvext.<field>'`` (the gateway renames it to the header where one set the pin:
    services/gateway/core/pins.py). ``every`` are all the model's workers, busy ones included. A pinned worker
    that already failed this request (a migration) may have left: not the client's mistake (a 503 follows)."""
    excluded = set(req.exclude_worker_ids)
    if req.worker_id and req.worker_id not in excluded:
        check_pin(req.worker_id, req.model, every)
        _refuse_prefill_worker(req.worker_id, req.model, every, PIN_PARAM,
                               f"pin its prefill leg with '{PREFILL_PIN_PARAM}'")
    if req.decode_worker_id and req.decode_worker_id not in excluded:
        if not any(c.answers_to(req.decode_worker_id) for c in every):
            raise InvalidRequest(f"'{DECODE_PIN_PARAM}' names worker {printable(req.decode_worker_id)}, which does "
                                 f"not serve model `{printable(req.model)}`", param=DECODE_PIN_PARAM)
        _refuse_prefill_worker(req.decode_worker_id, req.model, every, DECODE_PIN_PARAM, "it cannot decode")
    pin = req.prefill_worker_id
    if pin and pin not in excluded:
        role = next((c.role for c in every if c.answers_to(pin)), None)
        if role != PREFILL:
            why = "does not serve model" if role is None else f"is a {role} worker, not a prefill worker, of model"
            raise InvalidRequest(f"'{PREFILL_PIN_PARAM}' names worker {printable(pin)}, which {why} "
                                 f"`{printable(req.model)}`", param=PREFILL_PIN_PARAM)


def _refuse_prefill_worker(pin: str, model: str, every: Sequence[Candidate], param: str, advice: str) -> None:
    if any(c.answers_to(pin) and c.role == PREFILL for c in every):
        raise InvalidRequest(f"'{param}' names worker {printable(pin)}, a prefill worker of model "
                             f"`{printable(model)}`: {advice}", param=param)


class Disagg:
    """The disaggregation half of a routing decision; the router owns the bookings and the policy. ``kv``: the
    kv policy's view of caches and load, when it is the router's policy (else the bookings alone count)."""

    def __init__(self, settings: DisaggSettings, kv: KvAware | None, busy: BusyThreshold):
        self.settings = settings
        self._kv = kv
        self._busy = busy
        self.decisions: dict[str, int] = {}  # reason -> requests this replica routed so (metrics.py)

    def plain_decode(self, every: Sequence[Candidate], req: router_pb2.RouteRequest) -> bool:
        """Whether the decode worker is chosen by load alone: the request will be split (prefill workers
        exist, no worker pin) and the conditional decision is off, so the decode worker's cache is moot
        (it receives the whole prompt), as in Dynamo's plain decode pool."""
        if self.settings.conditional or (req.worker_id and not req.prefill_worker_id):
            return False
        return any(c.role == PREFILL for c in every)

    def least_decode_load(self, candidates: Sequence[Candidate]) -> Candidate:
        """The fewest active blocks (the kv policy's count, else the booked prompt), then sequences, then id."""
        return min(candidates, key=lambda c: (self.active_blocks(c), c.in_flight, c.worker_id))

    def active_blocks(self, c: Candidate) -> int:
        if self._kv is not None:
            return self._kv.active_blocks(c.worker_id)
        return math.ceil(c.booked_prompt_tokens / max(c.block_size, 1))

    def shape(self, req: router_pb2.RouteRequest, every: Sequence[Candidate], decode: Candidate,
              decode_overlap: int) -> Shape:
        shape = self._shape(req, every, decode, decode_overlap)
        self.decisions[shape.reason] = self.decisions.get(shape.reason, 0) + 1
        return shape

    def _shape(self, req: router_pb2.RouteRequest, every: Sequence[Candidate], decode: Candidate,
               decode_overlap: int) -> Shape:
        prefill_pool = [c for c in every if c.role == PREFILL]
        if not prefill_pool:
            # A worker pin runs where it says, enforced or not: the client chose aggregated.
            if self.settings.enforce and not req.worker_id:
                raise NoWorkers(f"No prefill worker serves `{req.model}`, and this router runs every request "
                                "disaggregated (--enforce-disagg).")
            return Shape(decode, decode_overlap, NO_PREFILL_WORKERS)
        if req.worker_id and not req.prefill_worker_id:
            return Shape(decode, decode_overlap, PINNED_WORKER)
        overlaps = self._kv.overlaps(req.block_hashes) if self._kv is not None else {}
        decode_overlap = max(decode_overlap, overlaps.get(decode.worker_id, 0))
        available = self._available(req, prefill_pool)
        if req.prefill_worker_id:
            # The pinned worker, or its least loaded data-parallel rank when the pin names no rank (dp_pins.py).
            pinned = min((c for c in available if c.answers_to(req.prefill_worker_id)), default=None,
                         key=lambda c: (c.booked_prompt_tokens, c.in_flight, c.worker_id))
            if pinned is None:
                raise NoWorkers(f"prefill worker {printable(req.prefill_worker_id)} cannot take this request now")
            return Shape(decode, decode_overlap, PINNED_PREFILL, pinned, overlaps.get(pinned.worker_id, 0))
        if not available:
            return Shape(decode, decode_overlap, PREFILL_UNAVAILABLE)
        prefill = self._least_prefill(available, overlaps, req.prompt_tokens)
        reason = decide(self.settings, SplitInput(
            prompt_tokens=req.prompt_tokens,
            decode_cached_tokens=min(req.prompt_tokens, decode_overlap * decode.block_size),
            prefill_waiting_tokens=prefill.booked_prompt_tokens, prefill_batch_tokens=prefill.max_num_batched_tokens,
            decode_active_blocks=self.active_blocks(decode) + len(req.block_hashes) - decode_overlap,
            decode_total_blocks=decode.total_kv_blocks))
        if reason in AGGREGATED_REASONS:
            return Shape(decode, decode_overlap, reason)
        return Shape(decode, decode_overlap, reason, prefill, overlaps.get(prefill.worker_id, 0))

    def _available(self, req: router_pb2.RouteRequest, pool: list[Candidate]) -> list[Candidate]:
        """Prefill workers this request may use now: not failed by it, not busy. None left: with
        --enforce-disagg the request fails (Overloaded when they are busy: it may wait in the queue)."""
        excluded = set(req.exclude_worker_ids)
        left = [c for c in pool if c.instance not in excluded]
        if not left:
            if self.settings.enforce:
                raise NoWorkers(f"No other prefill worker serves `{req.model}`.")
            return []
        try:
            return self._busy.available(left, lambda c: c.in_flight, req.model)
        except Overloaded:
            if self.settings.enforce:
                raise
            return []

    @staticmethod
    def _least_prefill(pool: Sequence[Candidate], overlaps: dict[str, int],
                       prompt_tokens: int) -> Candidate:
        """The prefill worker that starts this prompt soonest: its uncached tokens there plus the prefill tokens
        already waiting there; ties to the fewest legs in flight, then the id (replicas agree)."""
        def uncached(c: Candidate) -> int:
            return max(0, prompt_tokens - overlaps.get(c.worker_id, 0) * c.block_size)
        return min(pool, key=lambda c: (uncached(c) + c.booked_prompt_tokens, c.in_flight, c.worker_id))

