"""The router picks a pair (services/router/disagg.py): prefill by cached overlap and prefill queue, decode by
decode load; roles are never crossed; pins; conditional decisions and their reasons; bookings of both legs."""

from __future__ import annotations

import asyncio
import random

import pytest
from meshfront.router.v1 import router_pb2
from prometheus_client import CollectorRegistry

from services.common.discovery import BOTH, DECODE, PREFILL, ModelCard, WorkerCard
from services.common.errors import InvalidRequest, NoWorkers, Overloaded
from services.common.hashing import block_hashes, sequence_hashes
from services.common.overload import BusyThreshold
from services.router import assembly
from services.router.assembly import build_router
from services.router.core.conditional import DisaggSettings
from services.router.core.index import RadixIndex
from services.router.core.kv_ingest import KvEventIngest
from services.router.core.policies.kv_aware import KvAware
from services.router.disagg import prefill_leg_id
from services.router.metrics import RouterMetrics
from services.router.service import Router

pytestmark = pytest.mark.unit

BS = 16


def card(worker_id: str, role: str, blocks: int = 1000, batch: int = 1024) -> WorkerCard:
    return WorkerCard(worker_id, f"{worker_id}.local:1", ModelCard("m", "/m", block_size=BS), role=role,
                      total_kv_blocks=blocks, max_num_batched_tokens=batch)


PAIR = [card("p1", PREFILL), card("p2", PREFILL), card("d1", DECODE), card("d2", DECODE)]


def hashes(seed: int, blocks: int = 8) -> list[int]:
    rng = random.Random(seed)
    return block_hashes([rng.randrange(1000) for _ in range(blocks * BS)], BS)


def kv_router(cards=PAIR, settings: DisaggSettings | None = None,
              busy: BusyThreshold | None = None) -> tuple[Router, RadixIndex]:
    index = RadixIndex()
    policy = KvAware(index=index, approximate=False, rng=random.Random(0))
    return assembly.kv_router(lambda model: cards, policy, busy=busy, disagg=settings), index


def cache(index: RadixIndex, worker: str, local: list[int]) -> None:
    index.store(worker, None, zip(sequence_hashes(local), local, strict=True))


def route(router: Router, rid: str, local=(), prompt: int | None = None, **kw) -> router_pb2.RouteResponse:
    tokens = len(local) * BS if prompt is None else prompt
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", block_hashes=list(local),
                                                            prompt_tokens=tokens, **kw)))


def first_token(router: Router, rid: str) -> None:
    asyncio.run(router.release_batch(router_pb2.ReleaseBatchRequest(
        first_tokens=[router_pb2.FirstTokenReport(request_id=rid)])))


def release(router: Router, rid: str) -> None:
    asyncio.run(router.release(router_pb2.ReleaseRequest(request_id=rid)))


def test_without_prefill_workers_everything_runs_aggregated_as_before():
    router = Router(lambda model: [card("a", BOTH), card("b", DECODE)])
    seen = {route(router, f"r{i}", hashes(i)).worker_id for i in range(4)}
    r = route(router, "x", hashes(9))
    assert seen == {"a", "b"} and (r.prefill_worker_id, r.prefill_address) == ("", "")
    assert r.disaggregation_reason == "no_prefill_workers" and not r.report_first_token  # round-robin: as before


def test_a_split_request_names_both_workers_and_asks_for_the_first_token():
    router = Router(lambda model: PAIR)  # round-robin: the pair choice applies in every mode
    r = route(router, "r", hashes(1))
    assert r.prefill_worker_id in ("p1", "p2") and r.prefill_address == f"{r.prefill_worker_id}.local:1"
    assert r.worker_id in ("d1", "d2") and r.address == f"{r.worker_id}.local:1"
    assert r.disaggregation_reason == "disaggregated" and r.report_first_token


def test_roles_are_never_crossed():
    cards = [card("p1", PREFILL), card("p2", PREFILL), card("d1", DECODE), card("b1", BOTH)]
    router, _ = kv_router(cards)
    prefill, decode = set(), set()
    for i in range(40):
        r = route(router, f"r{i}", hashes(i))
        prefill.add(r.prefill_worker_id)
        decode.add(r.worker_id)
        if i % 3:
            release(router, f"r{i}")
    assert prefill == {"p1", "p2"} and decode == {"d1", "b1"}


def test_only_prefill_workers_is_a_503_not_a_prefill_worker_decoding():
    with pytest.raises(NoWorkers, match="only prefill workers"):
        route(Router(lambda model: [card("p1", PREFILL)]), "r", hashes(1))


def test_prefill_goes_where_the_prompt_is_cached():
    router, index = kv_router()
    local = hashes(7)
    cache(index, "p2", local[:6])
    r = route(router, "r", local)
    assert (r.prefill_worker_id, r.prefill_overlap_blocks) == ("p2", 6)


def test_prefill_queue_outweighs_a_small_overlap_and_empties_at_the_first_token():
    router, index = kv_router()
    cache(index, "p1", hashes(5)[:1])
    assert route(router, "a", hashes(1, blocks=32)).prefill_worker_id == "p1"  # tie: the id
    # p1 has 512 tokens waiting; 16 cached tokens there do not make up for them.
    assert route(router, "b", hashes(5)).prefill_worker_id == "p2"
    first_token(router, "a")
    first_token(router, "b")
    assert router.bookings.in_flight("p1") == router.bookings.in_flight("p2") == 0  # prefill legs over
    assert route(router, "c", hashes(5)).prefill_worker_id == "p1"  # its cache counts again


def test_decode_goes_by_decode_load_not_its_cache_when_every_request_is_split():
    router, index = kv_router()
    local = hashes(3)
    cache(index, "d1", local)
    assert route(router, "a", hashes(1, blocks=20)).worker_id == "d1"  # tie: the id
    # d1 holds this prompt but also 20 active blocks: the prompt reaches the decode worker by transfer anyway.
    assert route(router, "b", local).worker_id == "d2"
    release(router, "a")
    release(router, "b")
    assert route(router, "c", hashes(4)).worker_id == "d1"


def test_decode_ties_go_to_fewer_sequences():
    router = Router(lambda model: PAIR)
    route(router, "a", (), prompt=0)  # one sequence on d1, no blocks
    assert route(router, "b", (), prompt=0).worker_id == "d2"


def burst(router: Router, prompts: list[list[int]]) -> list[router_pb2.RouteResponse]:
    """Routes every prompt concurrently, none released: a burst that arrives before any request finishes."""
    async def go() -> list[router_pb2.RouteResponse]:
        return list(await asyncio.gather(*(router.route(router_pb2.RouteRequest(
            request_id=f"b{i}", model="m", block_hashes=p, prompt_tokens=len(p) * BS))
            for i, p in enumerate(prompts))))
    return asyncio.run(go())


def report(ingest: KvEventIngest, worker: str, seq: int, active_blocks: int) -> None:
    """The worker's KV event message carrying its own count of blocks in use (services/workers/kv_events.py)."""
    ingest.on_message({"worker_id": worker, "model": "m", "seq": seq, "events": [],
                       "load": {"active_blocks": active_blocks, "waiting": 0, "running": 1, "total_blocks": 1000}})


def kv_router_after_a_finished_request(worker: str = "d1") -> Router:
    """A kv router fed by KV events, whose ``worker`` still last reported the 40 blocks of a request that has
    since ended (reports come every 0.5 s; the release at once)."""
    ingest = KvEventIngest()
    router = build_router(lambda model: PAIR, "kv", ingest=ingest)
    route(router, "old", hashes(99, blocks=40), decode_worker_id=worker)
    report(ingest, worker, 1, 40)
    release(router, "old")
    return router


@pytest.mark.parametrize("make", [
    lambda: kv_router()[0],
    kv_router_after_a_finished_request,
    *(lambda mode=mode: build_router(lambda model: PAIR, mode)
      for mode in ("round-robin", "random", "least-loaded")),
], ids=["kv", "kv-stale-report", "round-robin", "random", "least-loaded"])
@pytest.mark.parametrize("same_prompt", [False, True], ids=["distinct", "same"])
def test_a_burst_of_split_requests_spreads_over_the_decode_workers(make, same_prompt):
    """Each decode booking counts toward its worker's decode load at once: eight prompts routed before any ends
    share the decode pool evenly, whether they differ or are one prompt (whose blocks a worker holds once).
    Failed (kv-stale-report, same) while a worker's last report was a floor under its bookings: all eight went
    to the other worker, whose deduplicated blocks never reached the stale 40."""
    router = make()
    prompts = [hashes(50 if same_prompt else 50 + i, blocks=24 + (0 if same_prompt else i)) for i in range(8)]
    responses = burst(router, prompts)
    assert all(r.prefill_worker_id for r in responses)  # every one split
    decode = [r.worker_id for r in responses]
    assert sorted(decode.count(w) for w in ("d1", "d2")) == [4, 4], decode
    assert router.bookings.in_flight("d1") == router.bookings.in_flight("d2") == 4


def test_a_report_counts_the_blocks_the_bookings_do_not_explain_until_the_next_one():
    """A worker's report above the router's bookings (output blocks, load placed by others) adds to its load;
    bookings made after it add on top at once; the next report replaces it."""
    ingest = KvEventIngest()
    router = build_router(lambda model: PAIR, "kv", ingest=ingest)
    route(router, "a", hashes(1, blocks=10), decode_worker_id="d1")
    report(ingest, "d1", 1, 25)  # 10 booked + 15 the router did not place
    assert router.policy.active_blocks("d1") == 25
    route(router, "b", hashes(2, blocks=8), decode_worker_id="d1")
    assert router.policy.active_blocks("d1") == 33
    report(ingest, "d1", 2, 18)  # the worker has not seen b yet: its report explains nothing beyond a
    assert router.policy.active_blocks("d1") == 18
    release(router, "a")
    assert router.policy.active_blocks("d1") == 8


def test_first_token_frees_the_prefill_leg_and_release_frees_both():
    router, _ = kv_router()
    r = route(router, "r", hashes(1))
    leg = prefill_leg_id("r")
    assert "r" in router.bookings and leg in router.bookings
    assert router.bookings.prompt_tokens(r.prefill_worker_id) == 8 * BS  # its uncached tokens wait there
    assert router.policy.active.load(r.worker_id).prefill_blocks == 0  # the decode worker computes nothing
    first_token(router, "r")
    assert leg not in router.bookings and "r" in router.bookings
    release(router, "r")
    assert len(router.bookings) == 0 and len(router.policy.active) == 0
    route(router, "s", hashes(2))
    release(router, "s")  # a release before any first token frees the prefill leg too
    assert len(router.bookings) == 0 and len(router.policy.active) == 0


def test_routing_again_replaces_the_old_pair():
    router, _ = kv_router()
    r = route(router, "r", hashes(1))
    again = route(router, "r", hashes(1), exclude_worker_ids=[r.prefill_worker_id])
    assert again.prefill_worker_id not in ("", r.prefill_worker_id)
    assert router.bookings.in_flight(r.prefill_worker_id) == 0 and len(router.bookings) == 2


# -- pins ----------------------------------------------------------------------------------------------


def test_a_prefill_pin_splits_there_even_when_the_request_would_stay_aggregated():
    router, index = kv_router(settings=DisaggSettings(conditional=True))
    local = hashes(1)
    cache(index, "d1", local)
    assert route(router, "a", local).disaggregation_reason == "cached_prompt"
    r = route(router, "b", local, prefill_worker_id="p2")
    assert (r.prefill_worker_id, r.disaggregation_reason) == ("p2", "pinned_prefill")


def test_a_decode_pin_decodes_there():
    router, _ = kv_router()
    for rid in ("a", "b"):
        r = route(router, rid, hashes(1), decode_worker_id="d2")
        assert r.worker_id == "d2" and r.prefill_worker_id


def test_a_worker_pin_runs_aggregated_there_unless_the_prefill_leg_is_pinned_too():
    router, _ = kv_router()
    r = route(router, "a", hashes(1), worker_id="d2")
    assert (r.worker_id, r.prefill_worker_id, r.disaggregation_reason) == ("d2", "", "pinned_worker")
    r = route(router, "b", hashes(1), worker_id="d2", prefill_worker_id="p1")
    assert (r.worker_id, r.prefill_worker_id) == ("d2", "p1")


@pytest.mark.parametrize(("pins", "param", "says"), [
    ({"prefill_worker_id": "nope"}, "nvext.prefill_worker_id", "which does not serve model `m`"),
    ({"prefill_worker_id": "d1"}, "nvext.prefill_worker_id", "is a decode worker, not a prefill worker"),
    ({"decode_worker_id": "nope"}, "nvext.decode_worker_id", "which does not serve model `m`"),
    ({"decode_worker_id": "p1"}, "nvext.decode_worker_id", "a prefill worker of model `m`: it cannot decode"),
    ({"worker_id": "p1"}, "nvext.backend_instance_id", "pin its prefill leg with 'nvext.prefill_worker_id'"),
    ({"worker_id": "nope"}, "nvext.backend_instance_id", "does not serve model `m`"),
])
def test_a_pin_to_an_unknown_worker_or_one_of_the_wrong_role_is_a_400_naming_the_field(pins, param, says):
    router, _ = kv_router()
    with pytest.raises(InvalidRequest) as e:
        route(router, "r", hashes(1), **pins)
    assert e.value.param == param and says in e.value.message


def test_a_prefill_pin_with_no_prefill_worker_registered_is_a_400():
    with pytest.raises(InvalidRequest) as e:
        route(Router(lambda model: [card("a", BOTH)]), "r", hashes(1), prefill_worker_id="a")
    assert e.value.param == "nvext.prefill_worker_id" and "is a both worker" in e.value.message


def test_a_busy_pinned_prefill_worker_is_a_503():
    router, _ = kv_router(busy=BusyThreshold(1))
    route(router, "a", hashes(1), prefill_worker_id="p1")
    with pytest.raises(NoWorkers, match="cannot take this request now"):
        route(router, "b", hashes(2), prefill_worker_id="p1")


# -- conditional disaggregation and enforcement --------------------------------------------------------


def test_conditional_keeps_a_cached_prompt_on_the_decode_worker_that_holds_it():
    router, index = kv_router(settings=DisaggSettings(conditional=True))
    local = hashes(1, blocks=40)
    cache(index, "d2", local[:36])
    r = route(router, "r", local)
    assert (r.worker_id, r.prefill_worker_id, r.disaggregation_reason) == ("d2", "", "cached_prompt")
    assert r.overlap_blocks == 36
    assert route(router, "s", hashes(2, blocks=40)).disaggregation_reason == "disaggregated"


def test_conditional_keeps_a_short_prompt_aggregated():
    router, _ = kv_router(settings=DisaggSettings(conditional=True, max_local_prefill_length=64))
    assert route(router, "short", hashes(1, blocks=4)).disaggregation_reason == "short_prompt"
    assert route(router, "long", hashes(2, blocks=5)).disaggregation_reason == "disaggregated"


def test_conditional_keeps_requests_off_a_busy_prefill_pool_unless_the_decode_worker_is_busy_too():
    settings = DisaggSettings(conditional=True, policy="prefill_load", prefill_busy_threshold=0.5,
                              decode_busy_threshold=0.5)
    cards = [card("p1", PREFILL, batch=256), card("d1", DECODE, blocks=100)]
    router, _ = kv_router(cards, settings)
    assert route(router, "a", hashes(1, blocks=20)).prefill_worker_id == "p1"  # 320 tokens now wait on p1
    r = route(router, "b", hashes(2, blocks=8))
    assert (r.prefill_worker_id, r.disaggregation_reason) == ("", "prefill_busy")
    # d1 now holds 28 active blocks; 28 more would pass half of its 100.
    assert route(router, "c", hashes(3, blocks=28)).disaggregation_reason == "decode_busy"


def test_busy_or_failed_prefill_workers_fall_back_to_aggregated():
    router, _ = kv_router([card("p1", PREFILL), card("d1", DECODE), card("d2", DECODE)], busy=BusyThreshold(1))
    route(router, "a", hashes(1))
    r = route(router, "b", hashes(2))
    assert (r.prefill_worker_id, r.disaggregation_reason) == ("", "prefill_unavailable")
    release(router, "a")
    release(router, "b")
    r = route(router, "c", hashes(3), exclude_worker_ids=["p1"])
    assert r.disaggregation_reason == "prefill_unavailable"


def test_enforce_disagg_never_falls_back_to_aggregated():
    enforce = DisaggSettings(enforce=True)
    with pytest.raises(NoWorkers, match="--enforce-disagg"):
        route(Router(lambda model: [card("a", BOTH)], disagg=enforce), "r", hashes(1))
    # A worker pin still runs where it says (the client chose aggregated; the gateway's warm-up pins so).
    assert route(Router(lambda model: [card("a", BOTH)], disagg=enforce), "r", hashes(1), worker_id="a").worker_id
    router, _ = kv_router([card("p1", PREFILL), card("d1", DECODE), card("d2", DECODE)], enforce, BusyThreshold(1))
    route(router, "a", hashes(1))
    with pytest.raises(Overloaded, match="Every worker serving `m` is busy"):  # d2 is free; p1 is not
        route(router, "b", hashes(2))
    release(router, "a")
    with pytest.raises(NoWorkers, match="No other prefill worker"):
        route(router, "c", hashes(3), exclude_worker_ids=["p1"])
    enforced_conditional = DisaggSettings(conditional=True, max_local_prefill_length=10_000, enforce=True)
    router, _ = kv_router([card("p1", PREFILL), card("d1", DECODE)], enforced_conditional)
    assert route(router, "d", hashes(4)).disaggregation_reason == "short_prompt"  # as in Dynamo: a choice


def test_each_decision_is_counted_by_reason():
    router, index = kv_router(settings=DisaggSettings(conditional=True))
    metrics = RouterMetrics(registry=CollectorRegistry(), disagg_decisions=router.disagg.decisions)
    local = hashes(1)
    cache(index, "d1", local)
    route(router, "a", local)
    route(router, "b", hashes(2))
    route(router, "c", hashes(3))
    route(router, "d", hashes(4), prefill_worker_id="p1")
    value = metrics.registry.get_sample_value
    assert value("meshfront_router_disagg_decisions_total", {"reason": "cached_prompt"}) == 1
    assert value("meshfront_router_disagg_decisions_total", {"reason": "disaggregated"}) == 2
    assert value("meshfront_router_disagg_decisions_total", {"reason": "pinned_prefill"}) == 1


class Relay:
    """Replica sync without NATS: what one router books or frees, the other applies as remote."""

    def __init__(self, to: Router):
        self.to = to

    def on_lifecycle(self, event, remote: bool) -> None:
        if not remote:
            self.to.apply(event, remote=True)


def test_replicas_hold_the_prefill_leg_too_and_free_it_wherever_the_first_token_lands():
    (a, _), (b, _) = kv_router(), kv_router()
    a.listeners.append(Relay(b))
    b.listeners.append(Relay(a))
    r = route(a, "r", hashes(1))
    for router in (a, b):
        assert router.bookings.in_flight(r.prefill_worker_id) == 1 and router.bookings.in_flight(r.worker_id) == 1
    first_token(b, "r")  # the report reaches the other replica
    for router in (a, b):
        assert router.bookings.in_flight(r.prefill_worker_id) == 0 and router.bookings.in_flight(r.worker_id) == 1
    release(a, "r")
    assert len(a.bookings) == len(b.bookings) == 0 and len(a.policy.active) == len(b.policy.active) == 0
