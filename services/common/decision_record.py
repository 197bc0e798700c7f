"""A routing decision, recorded: what the router saw of each candidate, what it chose, what it predicted.

Built only when a request asks for it (``RouteRequest.explain``: ``nvext.extra_fields: ["routing"]``), so
routing without it gathers nothing beyond what the policy computes anyway. The router fills in the
candidates, the choice and the predicted cached tokens; whoever sees the worker's usage (the gateway)
fills in the actual cached tokens later. A plain object shared by both (hence in common): the gateway
renders it as ``nvext.routing`` and a trace can put it on the route span (``as_dict``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# What chose the worker (RoutingDecision.chosen_by).
BY_POLICY, BY_PIN, BY_SESSION, BY_DECODE_LOAD = "policy", "pin", "session", "decode_load"


@dataclasses.dataclass(frozen=True)
class CandidateScore:
    """What the policy saw of one worker. ``active_blocks`` and ``score`` are kv's (None elsewhere)."""

    worker_id: str
    overlap_blocks: int = 0
    in_flight: int = 0
    booked_prompt_tokens: int = 0
    active_blocks: int | None = None
    score: float | None = None  # kv: the cost it minimised (lower wins)
    eligible: bool = True  # False: the policy did not weigh it (kv's hot-spot guard)
    # The worker's data-parallel rank this candidate is (services/common/dp_ranks.py); None: a worker without ranks.
    # In the router, worker_id is then the rank's target id; on the wire and in nvext, the worker's id.
    dp_rank: int | None = None


@dataclasses.dataclass
class DecisionRecord:
    policy: str
    chosen_by: str
    worker_id: str
    candidates: tuple[CandidateScore, ...]
    predicted_cached_tokens: int
    prompt_tokens: int
    prefill_worker_id: str = ""
    actual_cached_tokens: int | None = None  # unknown until the worker's first output
    dp_rank: int | None = None  # the chosen worker's data-parallel rank (None: it has none)

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values (``nvext.routing``); kv-only fields appear only when set."""
        out: dict[str, Any] = {
            "policy": self.policy,
            "chosen_by": self.chosen_by,
            "worker_id": self.worker_id,
            "candidates": [_candidate_dict(c) for c in self.candidates],
            "prompt_tokens": self.prompt_tokens,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "actual_cached_tokens": self.actual_cached_tokens,
        }
        if self.prefill_worker_id:
            out["prefill_worker_id"] = self.prefill_worker_id
        if self.dp_rank is not None:
            out["dp_rank"] = self.dp_rank
        return out


def _candidate_dict(c: CandidateScore) -> dict[str, Any]:
    out: dict[str, Any] = {"worker_id": c.worker_id, "overlap_blocks": c.overlap_blocks, "in_flight": c.in_flight,
                           "booked_prompt_tokens": c.booked_prompt_tokens, "eligible": c.eligible}
    if c.active_blocks is not None:
        out["active_blocks"] = c.active_blocks
    if c.score is not None:
        out["score"] = c.score
    if c.dp_rank is not None:
        out["dp_rank"] = c.dp_rank
    return out

