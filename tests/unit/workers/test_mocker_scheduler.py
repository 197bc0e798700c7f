"""The continuous-batching scheduler: budgets, admission, decode, cache hits, preemption, abort."""

from __future__ import annotations

import pytest

from services.workers.engine import FinishReason
from services.workers.mocker.kv_cache import KvCache
from services.workers.mocker.scheduler import Scheduler, SchedulerLimits
from services.workers.mocker.sequence import SeqState, Sequence, full_blocks

pytestmark = pytest.mark.unit

BS = 4


class CountingPlan:
    """Emits ``base + i`` at position i and finishes (LENGTH) after ``n`` tokens."""

    def __init__(self, n: int, base: int = 5000):
        self.n = n
        self.base = base

    def token_at(self, index: int) -> tuple[int, FinishReason]:
        return self.base + index, FinishReason.LENGTH if index == self.n - 1 else FinishReason.NONE


def make_seq(prompt: list[int], n_out: int = 4, rid: str = "r") -> Sequence:
    return Sequence(rid, list(prompt), CountingPlan(n_out), full_blocks(prompt, BS))


def scheduler(num_blocks: int = 64, **limits) -> Scheduler:
    return Scheduler(KvCache(num_blocks, BS), SchedulerLimits(**limits))


def run_to_completion(s: Scheduler, max_steps: int = 1000) -> int:
    steps = 0
    while s.has_work():
        s.step()
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps


def test_prefill_emits_the_first_token_then_one_token_per_step():
    s = scheduler()
    seq = make_seq(list(range(10)), n_out=3)
    s.add(seq)
    first = s.step()
    assert first.prefill_tokens == 10 and first.decode_tokens == 0
    assert [(e.index, e.token_id) for e in first.emitted] == [(0, 5000)]
    second = s.step()
    assert second.prefill_tokens == 0 and second.decode_tokens == 1
    third = s.step()
    assert third.emitted[0].finish is FinishReason.LENGTH
    assert seq.state is SeqState.FINISHED and not s.has_work()
    assert s.cache.active_blocks == 0
    assert seq.output == [5000, 5001, 5002]


def test_step_budget_chunks_long_prompts():
    s = scheduler(max_num_batched_tokens=16)
    a, b = make_seq(list(range(12)), rid="a"), make_seq(list(range(100, 112)), rid="b")
    s.add(a)
    s.add(b)
    out = s.step()
    assert out.prefill_tokens == 16  # all of a, a chunk of b
    assert [e.seq for e in out.emitted] == [a]
    assert b.num_computed == 4 and b.prefilling
    out = s.step()
    assert out.decode_tokens == 1 and out.prefill_tokens == 8  # a decodes, b finishes its prompt
    assert {e.seq.request_id for e in out.emitted} == {"a", "b"}


def test_without_chunking_a_prompt_waits_for_a_step_with_room():
    s = scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    a, b = make_seq(list(range(12)), rid="a"), make_seq(list(range(100, 112)), rid="b")
    s.add(a)
    s.add(b)
    out = s.step()
    assert out.prefill_tokens == 12 and b.state is SeqState.WAITING
    out = s.step()
    assert out.prefill_tokens == 12 and b.state is SeqState.RUNNING


def test_a_prompt_longer_than_the_budget_still_runs_without_chunking():
    s = scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    seq = make_seq(list(range(20)), n_out=1)
    s.add(seq)
    assert s.step().prefill_tokens == 20
    assert seq.finished


def test_max_num_seqs_caps_the_running_set():
    s = scheduler(max_num_seqs=2)
    seqs = [make_seq([i] * 5, rid=str(i)) for i in range(3)]
    for seq in seqs:
        s.add(seq)
    s.step()
    assert [q.state for q in seqs] == [SeqState.RUNNING, SeqState.RUNNING, SeqState.WAITING]
    run_to_completion(s)
    assert all(q.output == [5000, 5001, 5002, 5003] for q in seqs)


def test_a_repeated_prompt_reuses_its_cached_blocks():
    s = scheduler()
    prompt = list(range(13))  # three full blocks and one token
    first = make_seq(prompt, n_out=1)
    s.add(first)
    run_to_completion(s)
    assert first.cached_tokens == 0
    again = make_seq(prompt, n_out=1)
    s.add(again)
    out = s.step()
    assert again.cached_tokens == 12
    assert out.prefill_tokens == 1


def test_a_fully_cached_prompt_still_computes_its_last_token():
    s = scheduler()
    prompt = list(range(12))  # exactly three blocks
    s.add(make_seq(prompt, n_out=1))
    run_to_completion(s)
    again = make_seq(prompt, n_out=1)
    s.add(again)
    out = s.step()
    assert out.prefill_tokens == 1 and again.cached_tokens == 12
    assert again.output == [5000] and again.finished


def test_generated_blocks_are_committed_and_shared_by_identical_sequences():
    s = scheduler()
    a, b = make_seq([1, 2], n_out=6, rid="a"), make_seq([1, 2], n_out=6, rid="b")
    s.add(a)
    s.add(b)
    s.step()
    s.step()  # two prompt + two output tokens: the first block is full
    assert len(a.held) == 1 and a.held == b.held
    assert s.cache.refcount(a.held[0].block_hash) == 2
    run_to_completion(s)
    assert s.cache.active_blocks == 0 and s.cache.cached_blocks == 2


def test_memory_pressure_preempts_the_newest_sequence_and_replays_it_exactly():
    expected = {}
    for num_blocks in (64, 5):  # roomy, then tight enough to force preemption
        s = scheduler(num_blocks=num_blocks)
        seqs = [make_seq([10 + i] * 6, n_out=8, rid=str(i)) for i in range(2)]
        for seq in seqs:
            s.add(seq)
        run_to_completion(s)
        expected.setdefault("outputs", [q.output for q in seqs])
        assert [q.output for q in seqs] == expected["outputs"]
        assert s.cache.active_blocks == 0
        if num_blocks == 5:
            assert s.preemptions >= 1


def test_abort_frees_blocks_wherever_the_sequence_is():
    s = scheduler(max_num_seqs=1)
    running, waiting = make_seq(list(range(9)), n_out=50, rid="run"), make_seq(list(range(9)), rid="wait")
    s.add(running)
    s.add(waiting)
    s.step()
    s.step()
    assert s.cache.active_blocks > 0
    s.abort(waiting)
    s.abort(running)
    assert s.cache.active_blocks == 0
    assert not s.has_work()
    s.abort(running)  # idempotent
    assert running.finished and waiting.finished


def test_abort_all_returns_every_live_sequence():
    s = scheduler(max_num_seqs=1)
    seqs = [make_seq([i] * 5, rid=str(i)) for i in range(3)]
    for seq in seqs:
        s.add(seq)
    s.step()
    assert set(s.abort_all()) == set(seqs)
    assert s.cache.active_blocks == 0
