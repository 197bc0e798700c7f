"""A continuous-batching scheduler in the style of vLLM's, over the simulated KV cache.

Each ``step`` is one forward pass of the simulated engine:

1. every running sequence that finished its prefill decodes one token (one token of budget each);
2. sequences still prefilling continue, then waiting ones are admitted first come, first served,
   while ``max_num_seqs`` and the step's ``max_num_batched_tokens`` budget allow. With chunked
   prefill a long prompt is spread over several steps; without it a prompt is admitted only when
   it fits the budget left (or is the step's first prefill, so it cannot starve);
3. a sequence whose prefill completes emits its first token in the same step.

Admission takes every block of the prompt at once. Prefix hits (full blocks already cached) are
shared and never recomputed, except the last prompt token, whose logits give the first output;
``cached_tokens`` reports every hit token. When a growing sequence needs a new block
and none is free, the most recently admitted sequence is preempted (vLLM's default "lifo" policy):
it gives its blocks back, returns to the head of the queue and recomputes on readmission.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

from services.common.kv_events import StoredBlock
from services.workers.engine import FinishReason
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.sequence import SeqState, Sequence

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True


@dataclasses.dataclass(slots=True)
class Emitted:
    """A token a step produced for a sequence."""

    seq: Sequence
    index: int
    token_id: int
    finish: FinishReason


@dataclasses.dataclass(slots=True)
class StepOutcome:
    """What one step did; the timing model turns it into a duration."""

    emitted: list[Emitted] = dataclasses.field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    # KV blocks held when the step began: what the decode attention reads.
    active_blocks: int = 0
    # Prompt tokens of held prefill legs (``hold_on_finish``) whose KV the step computed, and whether it
    # found them cached instead: the engine times them for a pipelined transfer.
    held_prefill: list[tuple[Sequence, int, bool]] = dataclasses.field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.prefill_tokens and not self.decode_tokens


class Scheduler:
    """Waiting queue plus running set; not thread-safe (the engine drives it from one task)."""

    def __init__(self, cache: KvCache, limits: SchedulerLimits = SchedulerLimits()):
        self.cache = cache
        self.limits = limits
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self._preempted_in_step = False

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.state = SeqState.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Removes ``seq`` wherever it is and frees its blocks; a no-op once it finished."""
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
            self._unpin(seq)
        elif seq.state is SeqState.RUNNING:
            self.running.remove(seq)
            self._release_blocks(seq)
        seq.state = SeqState.FINISHED

    def release_finished(self, seq: Sequence) -> None:
        """Frees the blocks a finished sequence kept for a transfer (``hold_on_finish``) that will not happen."""
        self._release_blocks(seq)
        seq.hold_on_finish = False

    def abort_all(self) -> list[Sequence]:
        """Aborts everything (engine shutdown or failure) and returns what was aborted."""
        seqs = list(self.waiting) + list(self.running)
        for seq in seqs:
            self.abort(seq)
        return seqs

    def step(self) -> StepOutcome:
        out = StepOutcome(active_blocks=self.cache.active_blocks)
        self._preempted_in_step = False
        budget = self.limits.max_num_batched_tokens
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.state is SeqState.RUNNING and not seq.prefilling and self._reserve_slot(seq):
                budget -= 1
                out.decode_tokens += 1
                self._emit(seq, out)
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.state is SeqState.RUNNING and seq.prefilling:
                budget -= self._prefill(seq, budget, out)
        self._admit_waiting(budget, out)
        return out

    # -- admission and prefill -------------------------------------------------------------------

    def _admit_waiting(self, budget: int, out: StepOutcome) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            if self._preempted_in_step:  # memory is short: let running sequences finish first
                break
            seq = self.waiting[0]
            # Without chunking a prompt must fit what is left, unless it is the step's first
            # prefill (a prompt longer than the whole budget would otherwise wait forever).
            if (not self.limits.enable_chunked_prefill and out.prefill_tokens
                    and self._uncached_tokens(seq) > budget):
                break
            if not self._allocate(seq, out):
                break
            self.waiting.popleft()
            if seq.stream is not None:
                seq.stream.mark_scheduled()
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            budget -= self._prefill(seq, budget, out)

    def _cached_tokens(self, blocks: list[StoredBlock]) -> int:
        """Tokens covered by the leading run of ``blocks`` found in the cache."""
        return self.cache.match_prefix([b.block_hash for b in blocks]) * self.block_size

    def _uncached_tokens(self, seq: Sequence) -> int:
        cached = self._cached_tokens(seq.blocks_for_admission(self.block_size))
        return seq.total_tokens - min(cached, seq.total_tokens - 1)

    def _allocate(self, seq: Sequence, out: StepOutcome) -> bool:
        """Takes the blocks for every token so far; sets how much prefill is left."""
        bs = self.block_size
        blocks = seq.blocks_for_admission(bs)
        cached = self._cached_tokens(blocks)
        partial = 1 if seq.total_tokens % bs else 0
        if not self.cache.allocate(blocks, None, partial):
            return False
        seq.held = list(blocks)
        seq.holds_partial = bool(partial)
        self._unpin(seq)  # its own references hold the pulled blocks now
        seq.prefill_target = seq.total_tokens
        if seq.transferred_tokens >= seq.total_tokens - 1:
            # A decode leg whose prompt a prefill worker computed: what is left (the first output, appended to
            # the prompt) is the input of its first decode step, as in a real engine.
            seq.num_computed = seq.total_tokens
        else:
            # Even a fully cached prompt computes its last token: its logits give the first output.
            seq.num_computed = min(max(cached, seq.transferred_tokens), seq.total_tokens - 1)
        seq.transferred_tokens = 0
        if seq.hold_on_finish and seq.num_computed:
            out.held_prefill.append((seq, seq.num_computed, True))
        if seq.cached_tokens is None:
            seq.cached_tokens = cached
        return True

    def _prefill(self, seq: Sequence, budget: int, out: StepOutcome) -> int:
        """Computes a chunk of ``seq``'s prompt; returns the budget used."""
        remaining = seq.prefill_target - seq.num_computed
        chunk = min(remaining, budget) if self.limits.enable_chunked_prefill else remaining
        seq.num_computed += chunk
        out.prefill_tokens += chunk
        if chunk and seq.hold_on_finish:
            out.held_prefill.append((seq, chunk, False))
        if not remaining:
            out.decode_tokens += 1  # a transferred prompt: this token costs a decode step, not a prefill
        if not seq.prefilling and self._reserve_slot(seq):
            if seq.first_token_with_kv and not seq.output:
                # A pipelined decode leg: the first token came with the KV (the prefill worker's), so it is
                # out with this step, which computes the second.
                self._emit(seq, out)
                if seq.finished or not self._reserve_slot(seq):
                    return chunk
            self._emit(seq, out)
        return chunk

    # -- decode ----------------------------------------------------------------------------------

    def _reserve_slot(self, seq: Sequence) -> bool:
        """Makes room for one more token of ``seq``; False if ``seq`` itself had to be preempted."""
        if seq.total_tokens % self.block_size:
            return True  # the tail block has room
        while not self.cache.allocate_partial():
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        seq.holds_partial = True
        return True

    def _emit(self, seq: Sequence, out: StepOutcome) -> None:
        index = len(seq.output)
        token_id, finish = seq.plan.token_at(index)
        seq.output.append(token_id)
        if seq.total_tokens % self.block_size == 0:
            block = seq.tail_block(self.block_size)
            parent = seq.held[-1].block_hash if seq.held else None
            self.cache.commit_partial(block, parent)
            seq.held.append(block)
            seq.holds_partial = False
        out.emitted.append(Emitted(seq, index, token_id, finish))
        if finish:
            self.running.remove(seq)
            if not seq.hold_on_finish:  # a held prefill's blocks pass to the engine's KvHolds
                self._release_blocks(seq)
            seq.state = SeqState.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        log.debug("preempting %s (%d tokens)", seq.request_id, seq.total_tokens)
        self.running.remove(seq)
        self._release_blocks(seq)
        seq.num_computed = 0
        seq.prefill_target = 0
        seq.kv_computed = []
        seq.state = SeqState.WAITING
        self.waiting.appendleft(seq)
        self.preemptions += 1
        self._preempted_in_step = True

    def _unpin(self, seq: Sequence) -> None:
        if seq.pinned:
            self.cache.release(seq.pinned)
            seq.pinned = []

    def _release_blocks(self, seq: Sequence) -> None:
        self.cache.release([b.block_hash for b in seq.held])
        if seq.holds_partial:
            self.cache.release_partial()
        seq.held = []
        seq.holds_partial = False
