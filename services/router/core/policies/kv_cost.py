"""Dynamo's KV-router cost knobs, and the kv policy's cost of one worker with them.

Per candidate ``w``, in KV blocks (Dynamo's default selector, lib/kv-router/src/scheduling/selector/default.rs,
on the loads Meshfront's kv policy keeps; kv_aware.py says where each comes from)::

    raw_prefill(w) = prefill blocks of w's requests not yet past their first token + prompt blocks
                     (0 with --no-router-track-prefill-tokens)
    decay(w)       = 1 / (1 + credit_decay * (raw_prefill(w) - min over candidates) / prompt blocks)
    credit(w)      = overlap_score_credit * decay(w) * max(overlap(w), shared(w))
    prefill(w)     = max(0, raw_prefill(w) - credit(w))
    decode(w)      = active blocks of w's requests [+ blocks w reports beyond them: output blocks]
                     + prompt blocks - shared(w)          (0 with --no-router-track-active-blocks)
    cost(w)        = kv_overlap_weight * prefill_load_scale * prefill(w) + decode(w)
                     + decode_active_request_weight * requests on w

Meshfront's ``--kv-overlap-weight`` (5) and Dynamo's ``--router-prefill-load-scale`` (1) multiply: both scale
the prefill term, so a Dynamo launch line that sets the scale keeps Meshfront's measured weight under it,
and the defaults give the cost Meshfront always had. ``--router-assume-kv-reuse`` off counts every request's
blocks as its own (Dynamo's random hashes): ``shared(w)`` is then 0 and a burst of one prefix is not deduped.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class KvCost:
    """Dynamo's cost flags, with Dynamo's defaults (track_output_blocks: Meshfront's, see kv_aware.py)."""

    overlap_score_credit: float = 1.0
    overlap_score_credit_decay: float = 0.0
    prefill_load_scale: float = 1.0
    decode_active_request_weight: float = 0.0
    track_active_blocks: bool = True
    track_output_blocks: bool = True
    assume_kv_reuse: bool = True
    track_prefill_tokens: bool = True

    def errors(self) -> list[str]:
        """Each invalid setting, as the flag that sets it."""
        out = []
        for flag, value in (("--router-kv-overlap-score-credit", self.overlap_score_credit),
                            ("--router-kv-overlap-score-credit-decay", self.overlap_score_credit_decay),
                            ("--router-prefill-load-scale", self.prefill_load_scale),
                            ("--router-decode-active-request-weight", self.decode_active_request_weight)):
            if not math.isfinite(value) or value < 0:
                out.append(f"{flag} {value:g} must be finite and >= 0")
        return out


DEFAULT_COST = KvCost()


@dataclasses.dataclass(frozen=True)
class WorkerTerms:
    """What the cost of one worker is made of (blocks)."""

    raw_prefill: float  # its prefill in flight plus this prompt, before any credit
    overlap: int  # leading prompt blocks it caches or its running requests hold
    decode: float
    requests: int


def worker_cost(c: KvCost, prefill_scale: float, terms: WorkerTerms, prefill_floor: float, prompt_blocks: int) -> float:
    """``prefill_scale``: --kv-overlap-weight x --router-prefill-load-scale; ``prefill_floor``: the least
    raw prefill among the candidates (the decay compares against it)."""
    credit = c.overlap_score_credit
    if c.overlap_score_credit_decay > 0 and c.track_prefill_tokens:
        excess = (terms.raw_prefill - prefill_floor) / max(1, prompt_blocks)
        credit /= 1.0 + c.overlap_score_credit_decay * excess
    prefill = max(0.0, terms.raw_prefill - credit * terms.overlap)
    return prefill_scale * prefill + terms.decode + c.decode_active_request_weight * terms.requests
