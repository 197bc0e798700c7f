"""Data-parallel ranks in the router: each rank a candidate, the rank pins, and the ranks in what it answers.

A worker whose card declares ranks (services/common/dp_ranks.py) is one candidate per rank, under the rank's
target id: the bookings, the KV index (its events carry the rank), the kv policy's load, sessions and busy
detection all count per rank with no change of their own, as Dynamo's do per ``WorkerWithDpRank``. A worker
without ranks is one candidate under its own id, as before ranks existed.

Pins (Dynamo's ``nvext.dp_rank`` / ``x-dp-rank`` and ``nvext.prefill_dp_rank`` / ``x-prefill-dp-rank``,
dynamo-frontend.md §2 and §5.3):

- with a worker pin, the rank of that worker; without one, that rank of whichever worker the router chooses
  (the policy chooses among the workers' candidates of that rank);
- ``prefill_dp_rank`` narrows the prefill workers; unset, ``dp_rank`` does where a prefill worker has that rank
  (Dynamo's fallback), and nothing otherwise;
- a worker without ranks is rank 0; a rank that the pinned worker, or every worker of the model, lacks is a 400
  naming the field (a prefill rank where the model has no prefill workers pins nothing: the request runs
  aggregated);
- a worker pin with no rank on a worker with ranks goes to its least loaded admissible rank (policies.direct).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshfront.router.v1 import router_pb2

from services.common.cards import PREFILL, WorkerCard
from services.common.dp_ranks import split_target, target_id
from services.common.errors import InvalidRequest
from services.router.core.bookings import Bookings
from services.router.core.policies.direct import printable
from services.router.core.types import Candidate

DP_RANK_PARAM = "nvext.dp_rank"
PREFILL_DP_RANK_PARAM = "nvext.prefill_dp_rank"


def candidates_of(cards: Sequence[WorkerCard], bookings: Bookings) -> list[Candidate]:
    """Every card's candidates: one per rank, or the worker itself, with the load booked on each."""
    out = []
    for c in cards:
        ranks = c.dp_ranks
        for rank in (None,) if ranks is None else ranks:
            target = target_id(c.worker_id, rank)
            out.append(Candidate(target, c.address, bookings.in_flight(target), bookings.prompt_tokens(target),
                                 c.role, c.model.block_size, c.total_kv_blocks, c.max_num_batched_tokens, rank,
                                 c.worker_id if rank is not None else ""))
    return out


def targets_of(card: WorkerCard) -> list[str]:
    """The target ids a card's worker is routed under (what to forget when it leaves)."""
    ranks = card.dp_ranks
    return [card.worker_id] if ranks is None else [target_id(card.worker_id, r) for r in ranks]


def rank_of(c: Candidate) -> int:
    return 0 if c.dp_rank is None else c.dp_rank


def narrow_to_ranks(req: router_pb2.RouteRequest, every: list[Candidate]) -> list[Candidate]:
    """``every`` (all the model's candidates, busy ones included) less the ranks the pins rule out; raises
    InvalidRequest for a rank that does not exist where it is pinned."""
    decode_rank = req.dp_rank if req.HasField("dp_rank") else None
    prefill_rank = req.prefill_dp_rank if req.HasField("prefill_dp_rank") else None
    if decode_rank is None and prefill_rank is None:
        return every
    decoders = [c for c in every if c.role != PREFILL]
    prefills = [c for c in every if c.role == PREFILL]
    if decode_rank is not None:
        _check_rank(decode_rank, decoders, req.decode_worker_id or req.worker_id, DP_RANK_PARAM, req.model)
        decoders = [c for c in decoders if rank_of(c) == decode_rank]
    if prefill_rank is not None and prefills:  # no prefill workers: the request runs aggregated, nothing to pin
        _check_rank(prefill_rank, prefills, req.prefill_worker_id, PREFILL_DP_RANK_PARAM, req.model)
    elif decode_rank is not None and any(rank_of(c) == decode_rank for c in prefills):
        prefill_rank = decode_rank  # Dynamo's fallback, where the prefill pool has the rank
    if prefill_rank is not None:
        prefills = [c for c in prefills if rank_of(c) == prefill_rank]
    return decoders + prefills


def _check_rank(rank: int, pool: Sequence[Candidate], pin: str, param: str, model: str) -> None:
    if pin:
        pool = [c for c in pool if c.answers_to(pin)]
        if not pool:
            return  # the worker pin itself is wrong: check_pins says so, naming its field
    if any(rank_of(c) == rank for c in pool):
        return
    where = f"worker {printable(pin)}" if pin else f"no worker serving model `{printable(model)}`"
    ranks = sorted({rank_of(c) for c in pool})
    held = f" (its ranks: {', '.join(map(str, ranks))})" if pin else ""
    verb = "does not have" if pin else "has"
    raise InvalidRequest(f"'{param}' names data-parallel rank {rank}, which {where} {verb}{held}", param=param)


def answer(response: router_pb2.RouteResponse, chosen: Candidate, prefill: Candidate | None) -> None:
    """The chosen workers as RouteResponse names them: worker ids, and their ranks beside them."""
    response.worker_id = chosen.instance
    if chosen.dp_rank is not None:
        response.dp_rank = chosen.dp_rank
    if prefill is not None:
        response.prefill_worker_id = prefill.instance
        if prefill.dp_rank is not None:
            response.prefill_dp_rank = prefill.dp_rank


def name_target(target: str, score: router_pb2.CandidateScore) -> None:
    """A decision record's candidate, keyed by target id in the router, as the worker and its rank."""
    worker, rank = split_target(target)
    score.worker_id = worker
    if rank is not None:
        score.dp_rank = rank
