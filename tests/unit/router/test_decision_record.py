"""The routing decision record (RouteRequest.explain): what the router saw of each candidate and why it chose,
and the precision and recall gauges its predictions are scored by."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2
from prometheus_client import generate_latest

from services.common.discovery import ModelCard, WorkerCard
from services.common.hashing import block_hashes
from services.gateway.core.pipeline import decision_record
from services.router.assembly import build_router
from services.router.core.lifecycle import FIRST_TOKEN, LifecycleEvent
from services.router.core.policies import build_policy
from services.router.metrics import RouterMetrics
from services.router.service import Router

pytestmark = pytest.mark.unit

BS = 16
LOCAL = tuple(block_hashes(list(range(10 * BS)), BS))


def _cards(n: int) -> list[WorkerCard]:
    return [WorkerCard(f"w{i}", f"127.0.0.1:{9000 + i}", ModelCard("m", "/tmp", block_size=BS)) for i in range(n)]


def _route(router: Router, rid: str, explain: bool = True, **kw) -> router_pb2.RouteResponse:
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", block_hashes=LOCAL,
                                                            prompt_tokens=10 * BS, explain=explain, **kw)))


def test_kv_records_every_candidates_overlap_load_and_score_and_the_prediction():
    cards = _cards(3)
    router = build_router(lambda _m: cards, "kv")
    first = _route(router, "a")  # approximate mode: the chosen worker now holds the prompt (and runs it)
    second = _route(router, "b")
    d = second.decision
    assert d.policy == "kv" and d.chosen_by == "policy" and d.worker_id == second.worker_id
    by_worker = {c.worker_id: c for c in d.candidates}
    assert set(by_worker) == {"w0", "w1", "w2"}
    holder = by_worker[first.worker_id]
    assert holder.overlap_blocks == 10 and holder.in_flight == 1 and holder.active_blocks == 10
    assert all(c.HasField("score") and c.eligible for c in d.candidates)
    # The record agrees with the choice: the chosen worker has the lowest score.
    assert by_worker[d.worker_id].score == min(c.score for c in d.candidates)
    expected = min(d.prompt_tokens, by_worker[d.worker_id].overlap_blocks * BS)
    assert d.predicted_cached_tokens == expected and d.prompt_tokens == 10 * BS


def test_no_record_unless_asked():
    router = build_router(lambda _m: _cards(2), "kv")
    assert not _route(router, "a", explain=False).HasField("decision")


def test_policies_that_do_not_score_record_booked_load_and_a_pin_says_so():
    router = Router(lambda _m: _cards(2), build_policy("least-loaded"))
    _route(router, "a", explain=False)
    d = _route(router, "b").decision
    assert d.policy == "least-loaded" and d.chosen_by == "policy"
    assert sorted(c.in_flight for c in d.candidates) == [0, 1]
    assert not any(c.HasField("score") or c.HasField("active_blocks") for c in d.candidates)
    pinned = _route(router, "c", worker_id="w1").decision
    assert pinned.chosen_by == "pin" and pinned.worker_id == "w1"


def test_the_gateway_reads_the_record_and_renders_it_plainly():
    router = build_router(lambda _m: _cards(2), "kv")
    _route(router, "a", explain=False)
    record = decision_record(_route(router, "b").decision)
    assert record.actual_cached_tokens is None
    record.actual_cached_tokens = 128
    out = record.as_dict()
    assert out["actual_cached_tokens"] == 128 and out["policy"] == "kv"
    assert {c["worker_id"] for c in out["candidates"]} == {"w0", "w1"}
    assert all("score" in c and "active_blocks" in c for c in out["candidates"])


def _gauge(metrics: RouterMetrics, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_precision_and_recall_are_exported():
    metrics = RouterMetrics()
    for rid, predicted, actual in (("a", 100, 50), ("b", 0, 50)):
        metrics.on_lifecycle(LifecycleEvent("book", rid, "w0", "m", (), 200, 0, predicted))
        metrics.on_lifecycle(LifecycleEvent(FIRST_TOKEN, rid, prompt_tokens=200, cached_tokens=actual))
    # predicted 100, actual 100, correctly predicted min(100, 50) + min(0, 50) = 50
    assert _gauge(metrics, "meshfront_router_prediction_precision") == 0.5
    assert _gauge(metrics, "meshfront_router_prediction_recall") == 0.5
