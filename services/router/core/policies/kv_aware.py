"""kv: the worker that would finish this prompt's prefill soonest without piling load on one worker.

Per candidate ``w``, in KV blocks (Dynamo's selector, lib/kv-router/src/scheduling/selector.rs)::

    overlap(w)  = leading prompt blocks w caches (radix index: KV events, or own decisions)
    shared(w)   = leading prompt blocks that requests running on w hold
    prefill(w)  = prefill blocks of w's requests not yet past their first token
                  + prompt blocks - max(overlap(w), shared(w))
    decode(w)   = active blocks of w's requests + blocks w last reported in use beyond them
                  + prompt blocks - shared(w)
    logit(w)    = overlap_weight * prefill(w) + decode(w)

with Dynamo's cost flags on top (``cost``, kv_cost.py: overlap credit and its decay, prefill load scale, a
per-request decode weight, and what the loads track); their defaults give the formula above.
"blocks w last reported in use beyond them" are the output blocks (and load placed by others): counted unless
``--no-router-track-output-blocks``. Meshfront counts them by default, where Dynamo's default leaves them out
(its router adds output blocks only from its own per-token view, which Meshfront's router does not have);
``meshfront frontend`` takes Dynamo's default.

Temperature 0 picks the lowest logit, ties to the fewest in-flight requests, then at random;
temperature T > 0 samples ``p ~ exp(-((logit - min) / (max - min)) / T)``. The random draw is
seeded by the request id unless an RNG is injected, so router replicas holding the same state
make the same choice.

Hot-spot guard: a worker already running more than ``hotspot_ratio`` x its fair share of the
in-flight requests (this one included) is not a candidate. One flooding prefix therefore spills
to the next-cheapest workers, which then cache it too, instead of queueing behind one engine.

Parameters: ``overlap_weight`` (5.0), ``temperature`` (0.0), ``hotspot_ratio`` (3.0),
``approximate`` (predict from decisions instead of events), ``rng``. Optimises: TTFT through
prefix reuse, bounded by load.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence

from services.common.decision_record import CandidateScore
from services.common.hashing import sequence_hashes
from services.router.core.active import ActiveRequests
from services.router.core.approximate import ApproximateCache
from services.router.core.approximate_lru import LruApproximateCache
from services.router.core.index import RadixIndex
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, LifecycleEvent
from services.router.core.policies.kv_cost import DEFAULT_COST, KvCost, WorkerTerms, worker_cost
from services.router.core.types import Candidate, Decision, RouteQuery

# Measured, not guessed (bench/RESULTS.md, "KV-aware routing"): on the 16-group workload weight 1
# (Dynamo's default) lets load win so often that groups smear over workers (cached share 0.57 of a
# 0.75 ceiling); 3 gives 0.66-0.69, 5 gives 0.71-0.74, 8 no better. A one-prefix flood stays
# balanced at 5 because the in-flight prefill term still carries the weight. The hot-spot guard is
# a safety net (approximate mode, many workers): at 2 it skipped holders on the group bench and cost
# hits (0.71 vs 0.74); the flood never reached it.
DEFAULT_OVERLAP_WEIGHT = 5.0
DEFAULT_HOTSPOT_RATIO = 3.0


class KvAware:
    """The kv policy, and the router's view of workers' caches and load (``overlaps``, ``active_blocks``).

    Beyond ``choose`` it tracks every request's blocks and prefill: it hears the router's lifecycle as a
    listener (``on_lifecycle``: book, first token, free), subscribed at assembly (assembly.py ``kv_router``),
    and the router asks the gateway for first-token reports because of it (the first token ends a prefill).
    """

    reads_load = True  # active blocks and prefill tokens, of every replica's bookings

    def __init__(self, *, index: RadixIndex | None = None, overlap_weight: float = DEFAULT_OVERLAP_WEIGHT,
                 temperature: float = 0.0, hotspot_ratio: float = DEFAULT_HOTSPOT_RATIO,
                 approximate: bool | None = None, ttl_s: float = 120.0, cache_policy: str = "ttl",
                 cost: KvCost = DEFAULT_COST, rng: random.Random | None = None):
        if overlap_weight < 0 or temperature < 0 or hotspot_ratio < 1 or cost.errors():
            raise ValueError("overlap_weight and temperature must be >= 0, hotspot_ratio >= 1; "
                             + "; ".join(cost.errors()))
        if cache_policy not in ("ttl", "lru"):
            raise ValueError(f"approximate cache policy {cache_policy!r} is not ttl or lru")
        self.index = index or RadixIndex()
        self.overlap_weight = overlap_weight
        self.temperature = temperature
        self.hotspot_ratio = hotspot_ratio
        self.cost = cost
        # Without an index fed by events (none given), predict from our own decisions: forgotten by age (ttl) or
        # by each worker's capacity (lru, which learns capacities from the candidates in ``choose``).
        self.approximate: ApproximateCache | LruApproximateCache | None = None
        self._lru: LruApproximateCache | None = None
        if approximate if approximate is not None else index is None:
            if cache_policy == "lru":
                self.approximate = self._lru = LruApproximateCache(self.index)
            else:
                self.approximate = ApproximateCache(self.index, ttl_s=ttl_s)
        self.active = ActiveRequests()
        # Per worker, the blocks its last load report (note_report) held beyond this router's bookings then:
        # load we did not place (output tokens' blocks, other clients). Bookings made or freed since count on
        # top at once; a report is never a floor that hides them (a stale one sent a burst to one worker).
        self._unbooked: dict[str, int] = {}
        self._rng = rng
        self._pending: dict[str, tuple[int, ...]] = {}  # request id -> seq hashes, from choose to book
        # decisions; spills (chose less overlap than some worker had: load won); hot_skips (the guard
        # excluded a worker holding more of the prompt than the chosen one)
        self.stats: dict[str, int] = {"decisions": 0, "spills": 0, "hot_skips": 0}

    # -- choice ------------------------------------------------------------------------------------

    def choose(self, candidates: Sequence[Candidate], query: RouteQuery) -> Decision:
        local = query.block_hashes
        seq = tuple(sequence_hashes(local))
        self._pending[query.request_id] = seq
        if len(self._pending) > 4096:  # choices never booked (the caller failed in between)
            self._pending.pop(next(iter(self._pending)))
        if self.approximate is not None:
            self.approximate.expire()
        if self._lru is not None:
            for c in candidates:
                self._lru.capacity[c.worker_id] = c.total_kv_blocks
        overlaps = self.index.find_matches(local) if local else {}
        eligible = self._not_hot(candidates)
        terms = [self._terms(c.worker_id, len(seq), overlaps.get(c.worker_id, 0), seq) for c in eligible]
        floor = min(t.raw_prefill for t in terms)
        scale = self.overlap_weight * self.cost.prefill_load_scale
        logits = [worker_cost(self.cost, scale, t, floor, len(seq)) for t in terms]
        pick = self._pick(eligible, logits, query.request_id)
        expected = max(overlaps.get(pick.worker_id, 0), self.active.shared_prefix(pick.worker_id, seq))
        self._count(candidates, eligible, overlaps, expected)
        scores = self._scores(candidates, eligible, logits, overlaps, seq) if query.explain else ()
        return Decision(pick.worker_id, expected, scores)

    def _scores(self, candidates: Sequence[Candidate], eligible: Sequence[Candidate], logits: Sequence[float],
                overlaps: dict[str, int], seq: Sequence[int]) -> tuple[CandidateScore, ...]:
        """What ``choose`` saw of each candidate (asked for by RouteQuery.explain only)."""
        logit = {c.worker_id: x for c, x in zip(eligible, logits, strict=True)}
        return tuple(CandidateScore(c.worker_id, max(overlaps.get(c.worker_id, 0),
                                                     self.active.shared_prefix(c.worker_id, seq)),
                                    c.in_flight, c.booked_prompt_tokens, self.active_blocks(c.worker_id),
                                    logit.get(c.worker_id), c.worker_id in logit) for c in candidates)

    def overlaps(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, the prompt's leading blocks it caches or its running requests hold (as ``choose`` counts
        them): what the disaggregated pair choice weighs across both pools."""
        if self.approximate is not None:
            self.approximate.expire()
        found = dict(self.index.find_matches(local_hashes)) if local_hashes else {}
        seq = tuple(sequence_hashes(local_hashes))
        for w in self.active.workers():
            found[w] = max(found.get(w, 0), self.active.shared_prefix(w, seq))
        return found

    def active_blocks(self, worker_id: str) -> int:
        unbooked = self._unbooked.get(worker_id, 0) if self.cost.track_output_blocks else 0
        return self.active.load(worker_id).active_blocks + unbooked

    def note_report(self, worker_id: str, active_blocks: int) -> None:
        """The worker's own count of blocks in use (KvEventIngest load listener), as it arrives."""
        self._unbooked[worker_id] = max(0, active_blocks - self.active.load(worker_id).active_blocks)

    def _count(self, candidates, eligible, overlaps: dict[str, int], expected: int) -> None:
        self.stats["decisions"] += 1
        best = max(overlaps.values(), default=0)
        if best > expected:
            self.stats["spills"] += 1
            if len(eligible) < len(candidates) and max((overlaps.get(c.worker_id, 0) for c in eligible),
                                                       default=0) < best:
                self.stats["hot_skips"] += 1

    def _not_hot(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        loads = [self.active.load(c.worker_id).in_flight for c in candidates]
        cap = max(1, math.ceil(self.hotspot_ratio * (sum(loads) + 1) / len(candidates)))
        cool = [c for c, n in zip(candidates, loads, strict=True) if n < cap]
        return cool or list(candidates)

    def _terms(self, worker_id: str, prompt_blocks: int, overlap: int, seq: Sequence[int]) -> WorkerTerms:
        load = self.active.load(worker_id)
        shared = self.active.shared_prefix(worker_id, seq)
        # Blocks a running request on w holds are reused too (a paged cache shares them at once),
        # even before any event says they are cached: a burst of one prefix stays together.
        raw_prefill = load.prefill_blocks + prompt_blocks if self.cost.track_prefill_tokens else 0
        decode = self.active_blocks(worker_id) + prompt_blocks - shared if self.cost.track_active_blocks else 0
        return WorkerTerms(raw_prefill, max(overlap, shared), decode, load.in_flight)

    def _pick(self, candidates: Sequence[Candidate], logits: Sequence[float], request_id: str) -> Candidate:
        rng = self._rng or random.Random(zlib.crc32(request_id.encode()))
        lo, hi = min(logits), max(logits)
        if self.temperature > 0 and hi > lo:
            weights = [math.exp(-((x - lo) / (hi - lo)) / self.temperature) for x in logits]
            return rng.choices(list(candidates), weights=weights)[0]
        best = [c for c, x in zip(candidates, logits, strict=True) if x == lo]
        fewest = min(self.active.load(c.worker_id).in_flight for c in best)
        tied = sorted((c for c in best if self.active.load(c.worker_id).in_flight == fewest),
                      key=lambda c: c.worker_id)
        return tied[rng.randrange(len(tied))]

    # -- request lifecycle (also fed by replica sync) ----------------------------------------------

    def on_lifecycle(self, event: LifecycleEvent, remote: bool) -> None:
        """Replicas' events count as our own: every replica holds the same load (core/lifecycle.py)."""
        if event.kind == BOOK:
            self.book(event.request_id, event.worker_id, event.local_hashes, event.overlap_blocks)
        elif event.kind == FIRST_TOKEN:
            self.mark_prefilled(event.request_id)
        else:
            self.free(event.request_id)

    def book(self, request_id: str, worker_id: str, local_hashes: Sequence[int], overlap_blocks: int) -> None:
        seq = self._pending.pop(request_id, None)
        if seq is None or len(seq) != len(local_hashes):
            seq = tuple(sequence_hashes(local_hashes))
        prefill = max(0, len(seq) - overlap_blocks)
        # Without KV reuse (Dynamo's --no-router-assume-kv-reuse) every request's blocks are its own: ids no
        # prompt hashes to, so requests on one worker share none and none counts as a running prefix.
        held = seq if self.cost.assume_kv_reuse else tuple(-1 - i - (zlib.crc32(request_id.encode()) << 20)
                                                             for i in range(len(seq)))
        self.active.add(request_id, worker_id, held, prefill)
        if self.approximate is not None and seq:
            self.approximate.record(worker_id, seq, local_hashes)

    def mark_prefilled(self, request_id: str) -> bool:
        return self.active.mark_prefilled(request_id)

    def free(self, request_id: str) -> bool:
        self._pending.pop(request_id, None)
        return self.active.free(request_id)

    def drop_worker(self, worker_id: str) -> None:
        self.active.drop_worker(worker_id)
        self._unbooked.pop(worker_id, None)
        if self.approximate is not None:
            self.approximate.drop_worker(worker_id)
        else:
            self.index.drop_worker(worker_id)
