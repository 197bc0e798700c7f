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
