"""Dynamo's kv cost flags in the kv policy, power-of-two, and the lru approximate cache."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from services.common.hashing import block_hashes, sequence_hashes
from services.router.core.approximate_lru import LruApproximateCache
from services.router.core.index import RadixIndex
from services.router.core.policies import build_policy, policy_name
from services.router.core.policies.kv_aware import KvAware
from services.router.core.policies.kv_cost import KvCost, WorkerTerms, worker_cost
from services.router.core.policies.power_of_two import PowerOfTwo
from services.router.core.types import Candidate, RouteQuery

pytestmark = pytest.mark.unit

BS = 16
WORKERS = [Candidate(f"w{i}", f"127.0.0.1:{9000 + i}") for i in range(2)]


def prompt(seed: int, blocks: int = 10) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(block_hashes([rng.randrange(1000) for _ in range(blocks * BS)], BS))


def cached_on(worker: str, local, cost: KvCost, **kw) -> KvAware:
    index = RadixIndex()
    index.store(worker, None, zip(sequence_hashes(local), local, strict=True))
    return KvAware(index=index, cost=cost, rng=random.Random(0), **kw)


def choose(policy: KvAware, rid: str, local, candidates=WORKERS) -> str:
    return policy.choose(candidates, RouteQuery(rid, "m", tuple(local), len(local) * BS)).worker_id


def book(policy: KvAware, rid: str, worker: str, local) -> None:
    policy.book(rid, worker, local, 0)


def test_the_defaults_are_the_cost_meshfront_always_had():
    terms = WorkerTerms(raw_prefill=10, overlap=8, decode=12, requests=3)
    assert worker_cost(KvCost(), 5.0, terms, 10, 10) == 5.0 * (10 - 8) + 12


def test_no_overlap_credit_ignores_the_cache_and_more_than_one_clamps_the_prefill_at_zero():
    local = prompt(1)
    busy_holder = cached_on("w0", local, KvCost(overlap_score_credit=0.0))
    book(busy_holder, "load", "w0", prompt(2, blocks=2))  # a little load on the worker holding the prompt
    assert choose(busy_holder, "r", local) == "w1"  # the cache is worth nothing: the load decides
    assert choose(cached_on("w0", local, KvCost()), "r", local) == "w0"
    terms = WorkerTerms(raw_prefill=10, overlap=8, decode=0, requests=0)
    assert worker_cost(KvCost(overlap_score_credit=2.0), 1.0, terms, 10, 10) == 0.0


def test_the_prefill_scale_multiplies_the_kv_overlap_weight():
    terms = WorkerTerms(raw_prefill=10, overlap=4, decode=0, requests=0)
    policy = KvAware(overlap_weight=5.0, cost=KvCost(prefill_load_scale=0.5))
    assert policy.overlap_weight * policy.cost.prefill_load_scale == 2.5
    assert worker_cost(policy.cost, 2.5, terms, 10, 10) == 2.5 * 6


def test_the_decay_shrinks_the_credit_of_a_worker_with_excess_prefill():
    terms = WorkerTerms(raw_prefill=30, overlap=10, decode=0, requests=0)  # 20 blocks above the floor of 10
    plain = worker_cost(KvCost(), 1.0, terms, 10, 10)
    decayed = worker_cost(KvCost(overlap_score_credit_decay=1.0), 1.0, terms, 10, 10)
    assert plain == 20 and decayed == pytest.approx(30 - 10 / (1 + 2))
    at_floor = WorkerTerms(raw_prefill=10, overlap=10, decode=0, requests=0)
    assert worker_cost(KvCost(overlap_score_credit_decay=1.0), 1.0, at_floor, 10, 10) == 0.0


def test_the_request_weight_balances_request_counts():
    policy = KvAware(cost=KvCost(decode_active_request_weight=100.0), rng=random.Random(0))
    for i in range(3):  # three one-block requests on w0 against one ten-block request on w1
        book(policy, f"s{i}", "w0", prompt(10 + i, blocks=1))
    book(policy, "big", "w1", prompt(20, blocks=10))
    assert choose(policy, "r", prompt(30, blocks=2)) == "w1"
    unweighted = KvAware(rng=random.Random(0))
    for i in range(3):
        book(unweighted, f"s{i}", "w0", prompt(10 + i, blocks=1))
    book(unweighted, "big", "w1", prompt(20, blocks=10))
    assert choose(unweighted, "r", prompt(30, blocks=2)) == "w0"  # fewer blocks, though more requests


def test_without_prefill_tracking_only_decode_blocks_count():
    local = prompt(1)
    policy = cached_on("w1", local, KvCost(track_prefill_tokens=False))
    book(policy, "a", "w1", prompt(2, blocks=3))
    assert choose(policy, "r", local) == "w0"  # the cache is no prefill saved: decode blocks alone decide


def test_without_active_block_tracking_the_decode_term_is_zero():
    policy = KvAware(cost=KvCost(track_active_blocks=False))
    book(policy, "a", "w0", prompt(2, blocks=8))
    policy.mark_prefilled("a")
    assert policy._terms("w0", 4, 0, ()).decode == 0


def test_without_kv_reuse_running_requests_share_no_blocks():
    local = prompt(1)
    reuse, no_reuse = KvAware(), KvAware(cost=KvCost(assume_kv_reuse=False))
    for p in (reuse, no_reuse):
        book(p, "a", "w0", local)
        book(p, "b", "w0", local)
    seq = tuple(sequence_hashes(local))
    assert reuse.active.load("w0").active_blocks == 10 and reuse.active.shared_prefix("w0", seq) == 10
    assert no_reuse.active.load("w0").active_blocks == 20 and no_reuse.active.shared_prefix("w0", seq) == 0


def test_output_blocks_from_reports_count_unless_switched_off():
    on, off = KvAware(), KvAware(cost=KvCost(track_output_blocks=False))
    for p in (on, off):
        p.note_report("w0", 40)
    assert on.active_blocks("w0") == 40 and off.active_blocks("w0") == 0


def test_power_of_two_never_picks_the_most_loaded_of_three_and_is_a_named_mode():
    loads = [Candidate("w0", "a", in_flight=9), Candidate("w1", "b", in_flight=1), Candidate("w2", "c", in_flight=2)]
    policy = PowerOfTwo(rng=random.Random(7))
    picks = Counter(policy.choose(loads, RouteQuery(f"r{i}", "m")).worker_id for i in range(300))
    assert picks["w0"] == 0 and picks["w1"] > picks["w2"] > 0  # w2 wins only the draws of {w0, w2}
    assert policy_name(build_policy("power-of-two")) == "power-of-two"
    assert PowerOfTwo().choose(loads[:1], RouteQuery("r", "m")).worker_id == "w0"


def test_lru_keeps_each_worker_within_its_advertised_capacity_oldest_first():
    index = RadixIndex()
    cache = LruApproximateCache(index)
    cache.capacity["w0"] = 12
    a, b = prompt(1, blocks=8), prompt(2, blocks=8)
    cache.record("w0", tuple(sequence_hashes(a)), a)
    cache.record("w0", tuple(sequence_hashes(b)), b)
    assert len(cache) == 12
    assert index.find_matches(b) == {"w0": 8}  # the newest request whole
    assert index.find_matches(a) == {"w0": 4}  # the oldest keeps its head: its tail went first
    assert cache.expire() == 0  # no age limit under lru


def test_lru_is_the_kv_policys_approximate_cache_when_asked_and_learns_capacities_from_candidates():
    policy = KvAware(approximate=True, cache_policy="lru")
    assert isinstance(policy.approximate, LruApproximateCache)
    local = prompt(1, blocks=8)
    small = [Candidate("w0", "a", total_kv_blocks=4)]
    d = policy.choose(small, RouteQuery("r", "m", local, 8 * BS))
    policy.book("r", d.worker_id, local, d.overlap_blocks)
    assert policy.index.find_matches(local) == {"w0": 4}
    with pytest.raises(ValueError, match="not ttl or lru"):
        KvAware(cache_policy="fifo")
