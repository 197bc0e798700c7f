"""Dynamo's load model in the router: busy by prefill tokens and decode blocks, the queue threshold, wspt."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import Overloaded
from services.router import config as router_config
from services.router.assembly import build_router, load_thresholds
from services.router.core.lifecycle import BOOK, FIRST_TOKEN, FREE, LifecycleEvent
from services.router.core.load_model import LoadThresholds, Saturated, WorkerLoads
from services.router.core.types import Candidate
from services.router.core.wait_queue import WSPT, WaitQueue

pytestmark = pytest.mark.unit

MODEL = ModelCard("m", "/tmp")
CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{9000 + i}", MODEL, total_kv_blocks=100, max_num_batched_tokens=1000)
         for i in range(2)]


def _thresholds(**kw) -> LoadThresholds:
    return LoadThresholds(0, kw.get("decode"), kw.get("tokens"), kw.get("frac"), kw.get("queue"), WorkerLoads())


def _book(t: LoadThresholds, rid: str, worker: str, prompt: int, cached: int = 0) -> None:
    t.loads.on_lifecycle(LifecycleEvent(BOOK, rid, worker, "m", prompt_tokens=prompt, overlap_tokens=cached), False)


def _cand(worker: str = "w0", total: int = 100, batched: int = 1000) -> Candidate:
    return Candidate(worker, "a", total_kv_blocks=total, max_num_batched_tokens=batched)


def test_prefill_tokens_make_a_worker_busy_until_its_first_token():
    t = _thresholds(tokens=500)
    _book(t, "r1", "w0", 400, cached=100)  # 300 to prefill
    assert not t.worker_busy(_cand(), 1)
    _book(t, "r2", "w0", 300)
    assert t.worker_busy(_cand(), 2)  # 600 > 500, with two requests in flight only
    t.loads.on_lifecycle(LifecycleEvent(FIRST_TOKEN, "r2"), False)
    assert not t.worker_busy(_cand(), 2) and t.loads.prefill_tokens("w0") == 300
    t.loads.on_lifecycle(LifecycleEvent(FREE, "r1"), False)
    assert t.loads.prefill_tokens("w0") == 0


def test_the_fraction_reads_the_cards_max_num_batched_tokens_and_dynamos_default_without_one():
    t = _thresholds(frac=0.5)
    _book(t, "r1", "w0", 600)
    assert t.worker_busy(_cand(batched=1000), 1)
    assert not t.worker_busy(_cand(batched=2000), 1)
    assert not t.worker_busy(_cand(batched=0), 1)  # 10,000,000 stands in: the check cannot fire


def test_decode_blocks_are_the_booked_prompts_or_the_workers_report_whichever_is_more():
    t = _thresholds(decode=0.5)
    _book(t, "r1", "w0", 16 * 40)  # 40 blocks of 16
    assert not t.worker_busy(_cand(total=100), 1)
    t.loads.note_report("w0", 60)  # output blocks the bookings do not know of
    assert t.worker_busy(_cand(total=100), 1)
    assert not t.worker_busy(_cand(total=0), 1)  # no capacity known: no decode check, as in Dynamo
    t.loads.note_report("w1", 10, total_blocks=15)  # a report's total stands in for a card without one
    assert t.worker_busy(_cand("w1", total=0), 0)


def test_checks_or_together_and_none_disables_each():
    t = _thresholds(tokens=1000, decode=0.9)
    _book(t, "r1", "w0", 16 * 95)  # 1520 prefill tokens and 95 of 100 blocks: both fire
    assert t.worker_busy(_cand(), 1)
    only_decode = LoadThresholds(0, 0.99, None, None, None, t.loads)
    assert not only_decode.worker_busy(_cand(), 1)
    assert LoadThresholds(2, None, None, None, None, t.loads).worker_busy(_cand(), 2)  # the request count too


def test_without_prefill_tracking_prompts_are_no_prefill_load():
    t = LoadThresholds(0, None, 10, None, None, WorkerLoads(track_prefill_tokens=False))
    _book(t, "r1", "w0", 5000)
    assert t.loads.prefill_tokens("w0") == 0 and not t.worker_busy(_cand(), 1)


def test_a_split_requests_prefill_counts_on_its_prefill_worker_not_its_decode_worker():
    t = _thresholds(tokens=100)
    _book(t, "r1", "dec", 800)
    _book(t, "r1#prefill", "pre", 800)
    assert t.loads.prefill_tokens("dec") == 0 and t.loads.prefill_tokens("pre") == 800


def test_a_worker_that_leaves_takes_its_ranks_load_along():
    t = _thresholds(tokens=100)
    _book(t, "r1", "w0@dp1", 800)
    t.loads.note_report("w0@dp1", 5)
    t.loads.drop_worker("w0")
    assert t.loads.prefill_tokens("w0@dp1") == 0 and t.loads.decode_blocks("w0@dp1", 16) == 0


def _route(router, rid: str, prompt: int, **kw) -> router_pb2.RouteResponse:
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=prompt, **kw)))


def test_the_router_rejects_on_prefill_tokens_where_counting_requests_would_not():
    router = build_router(lambda m: CARDS, "least-loaded", busy=_thresholds(tokens=1500))
    for i in range(4):
        assert _route(router, f"long{i}", 1000).report_first_token  # it wants first tokens: they end prefills
    assert [router.bookings.in_flight(c.worker_id) for c in CARDS] == [2, 2]
    with pytest.raises(Overloaded):  # 2000 prefill tokens on each worker, behind two requests only
        _route(router, "next", 10)


def test_the_router_frees_a_worker_at_a_first_token():
    router = build_router(lambda m: CARDS, "least-loaded", busy=_thresholds(tokens=1500))
    chosen = {r: _route(router, r, 1000).worker_id for r in ("a", "b", "c", "d")}
    with pytest.raises(Overloaded):
        _route(router, "e", 10)
    done = router_pb2.FirstTokenReport(request_id="a", prompt_tokens=1000)
    assert _route(router, "e", 10, first_tokens=[done]).worker_id == chosen["a"]


def test_the_queue_threshold_holds_requests_until_a_first_token_frees_prefill_capacity():
    async def scenario():
        router = build_router(lambda m: CARDS, "least-loaded", busy=_thresholds(queue=0.5))
        a = await router.route(router_pb2.RouteRequest(request_id="a", model="m", prompt_tokens=600))
        await router.route(router_pb2.RouteRequest(request_id="b", model="m", prompt_tokens=600))
        waiting = asyncio.create_task(router.route(router_pb2.RouteRequest(request_id="c", model="m",
                                                                           prompt_tokens=100)))
        await asyncio.sleep(0.05)
        assert not waiting.done() and router.queue.waiting("m") == 1  # held, not a 503 (no --queue-timeout-s)
        await router.release_batch(router_pb2.ReleaseBatchRequest(
            first_tokens=[router_pb2.FirstTokenReport(request_id="a", prompt_tokens=600)]))
        return a.worker_id, (await asyncio.wait_for(waiting, 1)).worker_id

    freed, routed = asyncio.run(scenario())
    assert routed == freed


def test_saturation_is_an_overload_so_a_queue_drain_stops_at_it():
    t = _thresholds(queue=0.0)
    _book(t, "r1", "w0", 10)
    with pytest.raises(Saturated):
        t.available([_cand()], lambda c: 0, "m")
    assert issubclass(Saturated, Overloaded)


def test_wspt_serves_the_least_prefill_per_weight_first_and_fcfs_the_earliest():
    async def order(policy: str) -> list[str]:
        q: WaitQueue[str] = WaitQueue(policy=policy)
        for rid, tokens, jump in (("long", 4000, 0.0), ("short", 100, 0.0), ("urgent-long", 4000, 99.0)):
            q.push("m", rid, jump, tokens)
        served: list[str] = []

        def route(rid: str) -> str:
            served.append(rid)
            return rid
        q.drain("m", route)
        return served

    # wspt: (1 + 99) / 4000 = 0.025, then 1 / 100 = 0.01, then 1 / 4000; fcfs: the jump, then arrival
    assert asyncio.run(order(WSPT)) == ["urgent-long", "short", "long"]
    assert asyncio.run(order("fcfs")) == ["urgent-long", "long", "short"]


def test_flags_env_twins_and_none_build_the_thresholds():
    cfg = router_config.parse_config(["--active-prefill-tokens-threshold", "4096", "--router-queue-threshold", "None",
                                      "--router-queue-policy", "wspt"],
                                     {"DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD": "0.85",
                                      "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC": "None"})
    t = load_thresholds(cfg)
    assert isinstance(t, LoadThresholds)
    assert (t.active_decode_blocks, t.active_prefill_tokens, t.active_prefill_tokens_frac, t.queue_threshold) == \
        (0.85, 4096, None, None)
    assert type(load_thresholds(router_config.parse_config([], {}))) is not LoadThresholds  # nothing to track


@pytest.mark.parametrize(("argv", "message"), [
    (["--active-decode-blocks-threshold", "1.5"], "--active-decode-blocks-threshold 1.5 must be between 0.0 and 1.0"),
    (["--active-prefill-tokens-threshold", "-1"], "--active-prefill-tokens-threshold -1 must be >= 0"),
    (["--router-queue-threshold", "-0.1"], "--router-queue-threshold -0.1 must be finite and >= 0"),
    (["--router-kv-overlap-score-credit", "-1"], "--router-kv-overlap-score-credit -1 must be finite and >= 0"),
])
def test_bad_thresholds_are_refused_naming_the_flag(argv, message):
    with pytest.raises(ValueError, match=message):
        router_config.parse_config(argv, {})
