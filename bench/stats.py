"""Summaries of one load level: throughput and latency percentiles, in milliseconds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from bench.loadgen import LoadResult


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class LevelStats:
    concurrency: int
    sent: int
    ok: int
    errors: int
    wall_s: float
    req_per_s: float
    tokens_per_s: float
    ttft_ms: dict[int, float]  # percentile -> ms
    itl_ms: dict[int, float]  # per token
    itl_chunk_ms: dict[int, float]  # per arrival
    tokens_per_arrival: float
    mean_prompt_tokens: float
    mean_completion_tokens: float
    mean_cached_tokens: float
    first_errors: list[str]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def summarize(load: LoadResult) -> LevelStats:
    ok = [r for r in load.results if r.ok]
    errors = [r for r in load.results if not r.ok]
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    per_chunk: list[float] = []
    per_token: list[float] = []
    for r in ok:
        c, t = r.itl_gaps()
        per_chunk += c
        per_token += t
    arrivals = sum(len(r.arrivals) for r in ok)
    tokens = sum(r.completion_tokens for r in ok)
    wall = max(load.wall_s, 1e-9)
    n = max(1, len(ok))
    return LevelStats(
        concurrency=load.spec.concurrency, sent=len(load.results), ok=len(ok), errors=len(errors), wall_s=wall,
        req_per_s=len(ok) / wall, tokens_per_s=tokens / wall,
        ttft_ms={q: percentile(ttfts, q) for q in (50, 90, 99)},
        itl_ms={q: percentile([g * 1000 for g in per_token], q) for q in (50, 90, 99)},
        itl_chunk_ms={q: percentile([g * 1000 for g in per_chunk], q) for q in (50, 90, 99)},
        tokens_per_arrival=tokens / arrivals if arrivals else math.nan,
        mean_prompt_tokens=sum(r.prompt_tokens for r in ok) / n,
        mean_completion_tokens=tokens / n,
        mean_cached_tokens=sum(r.cached_tokens for r in ok) / n,
        first_errors=sorted({r.error for r in errors})[:3],
    )
