"""The kv policy: cost, temperature, tie-break, hot-spot guard, bookings, and the Router's lifecycle."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import orjson
import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.hashing import block_hashes, sequence_hashes
from services.router.assembly import build_router
from services.router.core.index import RadixIndex
from services.router.core.lifecycle import LifecycleEvent
from services.router.core.policies import kv_policy
from services.router.core.policies.kv_aware import KvAware
from services.router.core.types import Candidate, RouteQuery
from services.router.metrics import RouterMetrics

pytestmark = pytest.mark.unit

BS = 16
WORKERS = [Candidate(f"w{i}", f"127.0.0.1:{9000 + i}") for i in range(4)]


def prompt(group: int, unique: int, blocks: int = 10, shared: int = 8) -> tuple[int, ...]:
    rng = random.Random(group)
    tokens = [rng.randrange(1000) for _ in range(shared * BS)]
    rng = random.Random(10_000 + unique)
    tokens += [rng.randrange(1000) for _ in range((blocks - shared) * BS)]
    return tuple(block_hashes(tokens, BS))


def store(index: RadixIndex, worker: str, local) -> None:
    index.store(worker, None, zip(sequence_hashes(local), local, strict=True))


def route(policy: KvAware, rid: str, local, candidates=WORKERS) -> str:
    d = policy.choose(candidates, RouteQuery(rid, "m", tuple(local), len(local) * BS))
    policy.book(rid, d.worker_id, local, d.overlap_blocks)
    return d.worker_id


def test_registered_by_name():
    assert isinstance(kv_policy(), KvAware)


def test_prefers_the_worker_holding_the_prefix():
    index = RadixIndex()
    policy = KvAware(index=index, rng=random.Random(0))
    local = prompt(1, 1)
    store(index, "w2", local[:8])
    d = policy.choose(WORKERS, RouteQuery("r", "m", local, 160))
    assert d.worker_id == "w2" and d.overlap_blocks == 8


def test_load_outweighs_a_small_overlap():
    index = RadixIndex()
    policy = KvAware(index=index, rng=random.Random(0), overlap_weight=1, hotspot_ratio=100)
    store(index, "w0", prompt(1, 1)[:1])
    for i in range(3):  # w0 already has three unfinished prefills of other prompts
        policy.book(f"busy{i}", "w0", prompt(50 + i, i), 0)
    assert policy.choose(WORKERS, RouteQuery("r", "m", prompt(1, 2), 160)).worker_id != "w0"


def test_temperature_zero_ties_are_random_but_seeded_by_request_id():
    policy = KvAware(index=RadixIndex())
    picks = {policy.choose(WORKERS, RouteQuery(f"r{i}", "m", prompt(i, i), 160)).worker_id for i in range(40)}
    assert picks == {c.worker_id for c in WORKERS}
    # Another replica with the same state makes the same choice for the same request.
    other = KvAware(index=RadixIndex())
    for i in range(10):
        q = RouteQuery(f"x{i}", "m", prompt(i, i), 160)
        assert policy.choose(WORKERS, q) == other.choose(WORKERS, q)


def test_injected_rng_drives_tie_break():
    a = KvAware(index=RadixIndex(), rng=random.Random(3))
    b = KvAware(index=RadixIndex(), rng=random.Random(3))
    qs = [RouteQuery(f"r{i}", "m", (), 0) for i in range(20)]
    assert [a.choose(WORKERS, q).worker_id for q in qs] == [b.choose(WORKERS, q).worker_id for q in qs]


def test_positive_temperature_samples_cheaper_workers_more_often():
    index = RadixIndex()
    local = prompt(1, 1)
    store(index, "w1", local[:8])
    policy = KvAware(index=index, temperature=0.5, rng=random.Random(1))
    counts = Counter(policy.choose(WORKERS, RouteQuery(f"r{i}", "m", local, 160)).worker_id for i in range(400))
    assert counts.most_common(1)[0][0] == "w1"
    assert len(counts) > 1  # but not only w1


def test_bookings_count_until_free_and_prefill_until_first_token():
    policy = KvAware(index=RadixIndex(), rng=random.Random(0))
    local = prompt(1, 1)
    policy.book("r1", "w0", local, 0)
    load = policy.active.load("w0")
    assert (load.in_flight, load.active_blocks, load.prefill_blocks) == (1, 10, 10)
    policy.book("r2", "w0", prompt(1, 2), 8)  # shares 8 blocks with r1: counted once
    assert policy.active.load("w0").active_blocks == 12
    assert policy.mark_prefilled("r1")
    assert policy.active.load("w0").prefill_blocks == 2
    assert policy.free("r1") and policy.free("r2")
    assert policy.active.load("w0").in_flight == 0 and not policy.free("r2")


def test_hot_prefix_flood_spreads_over_all_workers():
    """Every request shares one long prefix; workers cache what they served (as their events say)."""
    index = RadixIndex()
    policy = KvAware(index=index, rng=random.Random(0))
    store(index, "w0", prompt(7, 0)[:8])  # w0 cached the hot prefix first
    live: list[str] = []
    per_worker = Counter()
    for i in range(400):
        rid, local = f"r{i}", prompt(7, i)
        worker = route(policy, rid, local)
        per_worker[worker] += 1
        store(index, worker, local)
        live.append(rid)
        if len(live) > 16:  # closed loop at concurrency 16
            policy.free(live.pop(0))
    share = max(per_worker.values()) / sum(per_worker.values())
    assert share <= 1.25 / 4, per_worker


def test_hot_spot_guard_caps_in_flight_even_when_one_worker_looks_cheapest():
    index = RadixIndex()
    policy = KvAware(index=index, rng=random.Random(0), overlap_weight=100, hotspot_ratio=1.5)
    store(index, "w0", prompt(7, 0)[:8])  # only w0 ever holds it (no events)
    for i in range(16):
        route(policy, f"r{i}", prompt(7, i))
    # cap = ceil(1.5 * (15 + 1) / 4) = 6 in flight before the 16th request
    assert policy.active.load("w0").in_flight <= 6


def test_unique_prompts_spread_like_round_robin():
    policy = KvAware(index=RadixIndex(), rng=random.Random(0))
    live, per_worker = [], Counter()
    for i in range(400):
        per_worker[route(policy, f"r{i}", prompt(1000 + i, i))] += 1
        live.append(f"r{i}")
        if len(live) > 16:
            policy.free(live.pop(0))
    assert max(per_worker.values()) <= 1.1 * 100 and min(per_worker.values()) >= 0.9 * 100


def test_approximate_mode_learns_from_its_own_decisions():
    policy = kv_policy()  # no event ingest given: approximate
    assert policy.approximate is not None
    first = route(policy, "r1", prompt(3, 1))
    policy.free("r1")
    d = policy.choose(WORKERS, RouteQuery("r2", "m", prompt(3, 2), 160))
    assert d.worker_id == first and d.overlap_blocks == 8


def _card(wid: str) -> WorkerCard:
    return WorkerCard(wid, f"127.0.0.1:{wid[-1]}", ModelCard("m", "/tmp", block_size=BS))


def test_router_lifecycle_release_first_token_and_replica_apply():
    cards = [_card(f"w{i}") for i in range(2)]
    routers = [build_router(lambda _m: cards, "kv") for _ in range(2)]
    metrics = RouterMetrics()
    routers[0].listeners.append(metrics)
    sent: list[LifecycleEvent] = []

    class Sync:
        def on_lifecycle(self, event, remote):  # what ReplicaSync would carry to the other replica
            if remote:
                return
            sent.append(event)
            routers[1].apply(LifecycleEvent.from_wire(event.to_wire("r0")), True)

    routers[0].listeners.append(Sync())
    local = prompt(1, 1)

    async def run():
        resp = await routers[0].route(router_pb2.RouteRequest(request_id="q", model="m", block_hashes=local,
                                                              prompt_tokens=170))
        assert routers[1].bookings.in_flight(resp.worker_id) == 1
        await routers[0].release_batch(router_pb2.ReleaseBatchRequest(first_tokens=[
            router_pb2.FirstTokenReport(request_id="q", cached_tokens=0, prompt_tokens=170)]))
        # The final Release lands on the other replica: the booking still goes everywhere.
        await routers[1].release(router_pb2.ReleaseRequest(request_id="q"))
        routers[0].apply(LifecycleEvent("free", "q"), True)
        return resp

    resp = asyncio.run(run())
    assert [e.kind for e in sent] == ["book", "first_token"]
    assert routers[0].bookings.in_flight(resp.worker_id) == 0 == routers[1].bookings.in_flight(resp.worker_id)
    # Both replicas predicted the same way: approximate mode recorded the booked blocks on both.
    for r in routers:
        assert r.policy.index.find_matches(local) == {resp.worker_id: 10}
    assert metrics.totals.requests == 1 and metrics.totals.prompt_tokens == 170
    assert metrics.totals.actual_hit_rate == 0.0


@pytest.mark.parametrize("form", ["route", "batch", "deprecated release"])
def test_a_first_token_report_ends_the_prefill_whichever_way_it_comes(form):
    """FirstTokenReport on a Route or a ReleaseBatch, or (from a gateway that predates it) the deprecated
    ReleaseRequest.first_token: the kv policy, a lifecycle listener, ends the request's prefill load."""
    cards = [_card("w0")]
    router = build_router(lambda _m: cards, "kv")
    metrics = RouterMetrics()
    router.listeners.append(metrics)
    local = prompt(1, 1)

    async def run():
        await router.route(router_pb2.RouteRequest(request_id="q", model="m", block_hashes=local, prompt_tokens=170))
        assert router.policy.active.load("w0").prefill_blocks == 10
        report = router_pb2.FirstTokenReport(request_id="q", cached_tokens=32, prompt_tokens=170)
        if form == "route":  # applied before the release beside it, and before routing the next request
            await router.route(router_pb2.RouteRequest(request_id="q2", model="m", first_tokens=[report]))
        elif form == "batch":
            await router.release_batch(router_pb2.ReleaseBatchRequest(first_tokens=[report]))
        else:
            await router.release(router_pb2.ReleaseRequest(request_id="q", first_token=True, cached_tokens=32,
                                                           prompt_tokens=170))

    asyncio.run(run())
    assert router.policy.active.load("w0").prefill_blocks == 0
    assert router.bookings.in_flight("w0") == (2 if form == "route" else 1)  # a first token releases nothing
    assert metrics.totals.requests == 1 and metrics.totals.actual_tokens == 32


def test_a_batch_applies_first_tokens_before_the_releases_it_carries():
    router = build_router(lambda _m: [_card("w0")], "kv")
    metrics = RouterMetrics()
    router.listeners.append(metrics)

    async def run():
        await router.route(router_pb2.RouteRequest(request_id="q", model="m", block_hashes=prompt(1, 1),
                                                   prompt_tokens=170))
        await router.release_batch(router_pb2.ReleaseBatchRequest(
            releases=[router_pb2.ReleaseRequest(request_id="q")],
            first_tokens=[router_pb2.FirstTokenReport(request_id="q", cached_tokens=16, prompt_tokens=170)]))

    asyncio.run(run())
    assert router.bookings.in_flight("w0") == 0 and len(router.policy.active) == 0
    assert metrics.totals.requests == 1  # scored: the report came before its release freed the prediction


def test_a_lifecycle_event_crosses_the_wire_whole_and_leaves_its_defaults_behind():
    full = LifecycleEvent("book", "q", "w1", "m", (1, 2, 3), 48, 2, 32, session_id="s", session_action="open",
                          session_timeout_s=30)
    wire = full.to_wire("r0")
    assert wire["router_id"] == "r0" and wire["local_hashes"] == (1, 2, 3)
    assert LifecycleEvent.from_wire(orjson.loads(orjson.dumps(wire))) == full
    free = LifecycleEvent("free", "q")
    assert free.to_wire("r0") == {"kind": "free", "request_id": "q", "router_id": "r0"}
