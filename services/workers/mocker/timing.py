"""How long a simulated engine step takes, and the clock the engine waits on.

The polynomial follows the shape of Dynamo's mocker defaults (fitted on an H100-class GPU serving
an 8B model), in milliseconds:

- prefill: ``26.2 + 7.41e-2 * n + 1.25e-6 * n**2`` for ``n`` uncached prompt tokens computed in the
  step: a fixed launch cost, a linear MLP term, a quadratic attention term (a 1k-token prompt takes
  ~101 ms, 8k tokens ~718 ms);
- decode: ``5.74 + 54.01 * u - 25.74 * u**2`` where ``u`` in [0, 1] is the fraction of KV blocks in
  use, so a step grows mildly as the batch (and its context) grows: 5.7 ms nearly empty,
  ~34 ms at a full cache.

A step that both prefills and decodes (a mixed batch) takes the sum. Every duration is divided by
the speed-up ratio; a ratio of 0 means no delay at all. The polynomials are fitted to an engine's whole
step, its scheduling included, so the mocker's own work between steps (delivering one, scheduling the
next) runs inside the modelled time and lengthens a step only where it overruns it (engine.py ``_run``).

Every coefficient is a mocker flag (``--prefill-ms-const``, ``--prefill-ms-per-token``,
``--prefill-ms-per-token-sq``, ``--decode-ms-const|lin|sq``; config.py). Dynamo 1.6.1's mocker has the
same decode polynomial but a faster prefill, ``16.50142 + 1.518344e-2 * n + 4.209989e-7 * n**2``
(its ``PerfModel::Polynomial``; the constants are in its ``_core`` binary): 6k tokens in ~123 ms where
these defaults take ~516 ms. bench/disagg.py gives ours Dynamo's, so that both run at one engine speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Protocol

from services.workers.mocker.scheduler import StepOutcome


@dataclasses.dataclass(frozen=True)
class TimingModel:
    speedup_ratio: float = 1.0
    total_blocks: int = 16384
    prefill_ms_const: float = 26.2
    prefill_ms_per_token: float = 7.41e-2
    prefill_ms_per_token_sq: float = 1.25e-6
    decode_ms_const: float = 5.74
    decode_ms_lin: float = 54.01
    decode_ms_sq: float = -25.74

    @property
    def instant(self) -> bool:
        return self.speedup_ratio == 0

    def prefill_ms(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.prefill_ms_const + self.prefill_ms_per_token * tokens + self.prefill_ms_per_token_sq * tokens**2

    def decode_ms(self, active_blocks: int) -> float:
        u = min(1.0, active_blocks / self.total_blocks)
        return self.decode_ms_const + self.decode_ms_lin * u + self.decode_ms_sq * u * u

    def step_seconds(self, outcome: StepOutcome) -> float:
        """Wall time of one step at the configured speed-up (0 when instant)."""
        if self.instant or outcome.idle:
            return 0.0
        ms = self.prefill_ms(outcome.prefill_tokens)
        if outcome.decode_tokens:
            ms += self.decode_ms(outcome.active_blocks)
        return ms / 1000.0 / self.speedup_ratio


class Clock(Protocol):
    """Time source for the engine loop; tests inject a fake that never really sleeps."""

    def now(self) -> float:
        """Monotonic seconds."""

    async def sleep(self, seconds: float) -> None:
        """Suspends for ``seconds`` (and at least yields to the event loop)."""


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
