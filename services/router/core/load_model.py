"""Dynamo's load model for admission: when a worker is busy, and when requests queue at the router.

Per worker the router keeps (``WorkerLoads``, a lifecycle listener):

- active prefill tokens: the prompt tokens of its requests not yet past their first token, less what the
  router predicted cached (a split request's prefill leg counts on its prefill worker, not its decode
  worker). ``--no-router-track-prefill-tokens`` stops counting them, as Dynamo does;
- active decode blocks: the larger of the blocks its booked prompts take (their tokens over the worker's
  block size) and the blocks the worker last said it has in use (its load report, read where the router reads
  KV events). Dynamo ORs the same two signals: its scheduler's own count and the worker's ``kv_used_blocks``.

``LoadThresholds`` (a ``BusyThreshold``, so the router, the disaggregated pair choice and the LoRA placement
apply it where they applied the request count) marks a worker busy when ANY configured check fires, Dynamo's
OR logic (lib/llm/src/discovery/worker_monitor.rs ``is_overloaded``):

- ``--max-in-flight-per-worker`` N: N or more requests booked (Meshfront's own check);
- ``--active-decode-blocks-threshold`` F: active decode blocks > F x the card's total KV blocks (no total
  on the card or in a report: the check cannot fire, as in Dynamo);
- ``--active-prefill-tokens-threshold`` T: active prefill tokens > T;
- ``--active-prefill-tokens-threshold-frac`` F: active prefill tokens > F x the card's
  max_num_batched_tokens (10,000,000 when the card has none: Dynamo's ``DEFAULT_MAX_TOKENS``).

Every worker busy: the request fails with 503 (or waits with ``--queue-timeout-s``). Separately,
``--router-queue-threshold`` Q holds requests at the router while every non-busy worker has more than
Q x max_num_batched_tokens of prefill in flight (``Saturated``): they wait in the router's queue, ordered
by ``--router-queue-policy`` (core/wait_queue.py), until a first token or a release frees prefill capacity.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from services.common.dp_ranks import split_target
from services.common.errors import Overloaded
from services.common.overload import RETRY_AFTER_S, BusyThreshold
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, LifecycleEvent
from services.router.core.types import Candidate

T = TypeVar("T")

# Dynamo's stand-in for a worker that does not say its max_num_batched_tokens: the fractional checks never fire.
DEFAULT_MAX_BATCHED_TOKENS = 10_000_000
_PREFILL_LEG = "#prefill"  # services/router/disagg.py prefill_leg_id: a split request's prefill booking


class Saturated(Overloaded):
    """Every worker has more prefill in flight than --router-queue-threshold allows: the request waits in the
    router's queue (an ``Overloaded``, so a queue drain stops at it) instead of failing."""


@dataclasses.dataclass
class _Booked:
    worker_id: str
    prefill_tokens: int  # 0 once past the first token
    prompt_tokens: int


class WorkerLoads:
    """Per worker, active prefill tokens and decode blocks, from the router's lifecycle and load reports."""

    def __init__(self, track_prefill_tokens: bool = True):
        self.track_prefill_tokens = track_prefill_tokens
        self._requests: dict[str, _Booked] = {}
        self._prefill: collections.Counter[str] = collections.Counter()
        self._prompt: collections.Counter[str] = collections.Counter()
        self._reported: dict[str, tuple[int, int]] = {}  # worker -> (active blocks, total blocks) it reported

    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        if event.kind == BOOK:
            self._book(event)
        elif event.kind == FIRST_TOKEN:
            self._prefilled(event.request_id)
        else:
            self._free(event.request_id)

    def _book(self, event: LifecycleEvent) -> None:
        self._free(event.request_id)
        rid, worker = event.request_id, event.worker_id
        if rid.endswith(_PREFILL_LEG):
            # Booked with the tokens it computes; its decode leg (booked just before) computes none.
            prefill = event.prompt_tokens
            self._prefilled(rid[: -len(_PREFILL_LEG)])
        else:
            prefill = max(0, event.prompt_tokens - event.overlap_tokens)
        if not self.track_prefill_tokens:
            prefill = 0
        self._requests[rid] = _Booked(worker, prefill, event.prompt_tokens)
        self._prefill[worker] += prefill
        self._prompt[worker] += event.prompt_tokens

    def _prefilled(self, request_id: str) -> None:
        booked = self._requests.get(request_id)
        if booked is not None and booked.prefill_tokens:
            self._prefill[booked.worker_id] -= booked.prefill_tokens
            booked.prefill_tokens = 0

    def _free(self, request_id: str) -> None:
        booked = self._requests.pop(request_id, None)
        if booked is None:
            return
        w = booked.worker_id
        self._prefill[w] -= booked.prefill_tokens
        self._prompt[w] -= booked.prompt_tokens
        if self._prompt[w] <= 0 and self._prefill[w] <= 0:
            del self._prompt[w]
            self._prefill.pop(w, None)

    def note_report(self, worker_id: str, active_blocks: int, total_blocks: int = 0) -> None:
        """The worker's own count of KV blocks in use (and its total), as its load report says."""
        self._reported[worker_id] = (active_blocks, total_blocks)

    def drop_worker(self, worker_id: str) -> None:
        """A worker left: its load goes, that of each of its data-parallel ranks too (keyed by their targets)."""
        def gone(target: str) -> bool:
            return split_target(target)[0] == worker_id
        for rid in [r for r, b in self._requests.items() if gone(b.worker_id)]:
            self._free(rid)
        for target in [t for t in self._reported if gone(t)]:
            del self._reported[target]

    def prefill_tokens(self, worker_id: str) -> int:
        return self._prefill.get(worker_id, 0)

    def decode_blocks(self, worker_id: str, block_size: int) -> int:
        booked = math.ceil(self._prompt.get(worker_id, 0) / max(1, block_size))
        return max(booked, self._reported.get(worker_id, (0, 0))[0])

    def total_blocks(self, worker_id: str, card_total: int) -> int:
        return card_total or self._reported.get(worker_id, (0, 0))[1]


@dataclasses.dataclass(frozen=True)
class LoadThresholds(BusyThreshold):
    """Dynamo's busy thresholds and queue threshold over ``loads``; None disables a check (module docstring)."""

    active_decode_blocks: float | None = None
    active_prefill_tokens: int | None = None
    active_prefill_tokens_frac: float | None = None
    queue_threshold: float | None = None
    loads: WorkerLoads = dataclasses.field(default_factory=WorkerLoads, compare=False)

    @property
    def enabled(self) -> bool:
        return super().enabled or self.reads_loads

    @property
    def reads_loads(self) -> bool:
        """Whether a check reads the prefill tokens or decode blocks (the router then wants first tokens)."""
        return (self.active_decode_blocks is not None or self.active_prefill_tokens is not None
                or self.active_prefill_tokens_frac is not None or self.queue_threshold is not None)

    def is_busy(self, in_flight: int) -> bool:
        """The request count's check alone (``enabled`` also covers the load checks, which it must not read)."""
        return self.max_in_flight > 0 and in_flight >= self.max_in_flight

    def worker_busy(self, c: Candidate, in_flight: int) -> bool:
        if self.is_busy(in_flight):
            return True
        prefill = self.loads.prefill_tokens(c.worker_id)
        if self.active_prefill_tokens is not None and prefill > self.active_prefill_tokens:
            return True
        if self.active_prefill_tokens_frac is not None and \
                prefill > self.active_prefill_tokens_frac * (c.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS):
            return True
        if self.active_decode_blocks is not None:
            total = self.loads.total_blocks(c.worker_id, c.total_kv_blocks)
            return total > 0 and self.loads.decode_blocks(c.worker_id, c.block_size) > self.active_decode_blocks * total
        return False

    def saturated(self, c: Candidate) -> bool:
        """More prefill in flight than --router-queue-threshold allows (never, when it is unset)."""
        if self.queue_threshold is None:
            return False
        limit = self.queue_threshold * (c.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS)
        return self.loads.prefill_tokens(c.worker_id) > limit

    def available(self, workers: Sequence[T], in_flight: Callable[[T], int], model: str) -> list[T]:
        """The workers that are not busy.

        Raises:
            Overloaded: every worker is busy.
            Saturated: some are not, but every one of those is past the queue threshold.
        """
        if not self.reads_loads:
            return super().available(workers, in_flight, model)
        free = [w for w in workers if not self.worker_busy(_candidate(w), in_flight(w))]
        if not free:
            raise Overloaded(f"Every worker serving `{model}` is busy; retry in {RETRY_AFTER_S} s.",
                             code="overloaded")
        if all(self.saturated(_candidate(w)) for w in free):
            raise Saturated(f"Every worker serving `{model}` is past the router's queue threshold.",
                            code="overloaded")
        return free


def _candidate(w: object) -> Candidate:
    # BusyThreshold.available is generic; the router only ever gives it Candidates.
    if not isinstance(w, Candidate):
        raise TypeError(f"load thresholds weigh router candidates, not {type(w).__name__}")
    return w
