"""Plain types the routing policies see; no protobuf, no grpc."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.decision_record import CandidateScore


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A live worker that serves the requested model, with the load this router booked on it."""

    worker_id: str
    address: str
    in_flight: int = 0
    booked_prompt_tokens: int = 0
    # From the worker's card: its part in disaggregated serving (prefill, decode, both) and capacity
    # (0: not reported), which the pair choice and conditional disaggregation read (disagg.py).
    role: str = "both"
    block_size: int = 16
    total_kv_blocks: int = 0
    max_num_batched_tokens: int = 0
    # One data-parallel rank of a worker (services/common/dp_ranks.py): worker_id is then the rank's target id
    # (``<worker>@dp<rank>``, what bookings, the KV index and load are keyed by) and instance_id the worker's.
    # None / "": a worker without ranks, whose worker_id is its own.
    dp_rank: int | None = None
    instance_id: str = ""

    @property
    def instance(self) -> str:
        """The worker (what pins, exclusions and cards name), whichever rank of it this is."""
        return self.instance_id or self.worker_id

    def answers_to(self, pin: str) -> bool:
        """Whether a pin (a worker id, or a rank's target id) names this candidate."""
        return pin == self.worker_id or pin == self.instance_id


@dataclasses.dataclass(frozen=True)
class RouteQuery:
    """What a policy may look at to choose."""

    request_id: str
    model: str
    block_hashes: tuple[int, ...] = ()
    prompt_tokens: int = 0
    pinned_worker_id: str = ""
    explain: bool = False  # the caller wants the decision's record: a scoring policy fills Decision.scores


@dataclasses.dataclass(frozen=True)
class Decision:
    """The chosen worker and how many prompt blocks it is expected to hold already."""

    worker_id: str
    overlap_blocks: int = 0
    # Only when RouteQuery.explain asked and the policy scores candidates (kv): what it saw of each.
    scores: tuple[CandidateScore, ...] = ()
