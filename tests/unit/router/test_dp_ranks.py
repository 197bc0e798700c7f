"""Data-parallel ranks in the router (services/router/dp_pins.py): each rank of a worker is a candidate of its own,
indexed, loaded and booked on its own; the rank pins; the answer names the worker and its rank."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.dp_ranks import split_target, target_id
from services.common.errors import InvalidRequest
from services.common.hashing import block_hashes, sequence_hashes
from services.common.overload import BusyThreshold
from services.router.assembly import build_router
from services.router.core.kv_ingest import KvEventIngest, Verdict
from services.router.service import Router

pytestmark = pytest.mark.unit

BS = 16
RANKED = WorkerCard("dp", "127.0.0.1:9000", ModelCard("m", "/tmp"), data_parallel_size=2)
PLAIN = WorkerCard("solo", "127.0.0.1:9001", ModelCard("m", "/tmp"))


def route(router: Router, rid: str, **pins) -> router_pb2.RouteResponse:
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=64, **pins)))


def stored(worker: str, rank: int | None, seq: int, tokens: list[int]) -> dict:
    local = block_hashes(tokens, BS)
    msg = {"worker_id": worker, "model": "m", "seq": seq, "events": [{"stored": {"parent_hash": None, "blocks": [
        {"block_hash": h, "tokens_hash": t} for h, t in zip(sequence_hashes(local), local, strict=True)]}}]}
    if rank is not None:
        msg["dp_rank"] = rank
    return msg


def synced_ingest(*targets: str) -> KvEventIngest:
    ingest = KvEventIngest()
    for t in targets:
        ingest.load_dump(t, 0, [])
    return ingest


def test_target_ids_split_back_and_cards_declare_their_ranks():
    assert target_id("w", None) == "w" and target_id("w", 3) == "w@dp3"
    assert split_target("w@dp3") == ("w", 3) and split_target("w") == ("w", None)
    assert list(RANKED.dp_ranks or ()) == [0, 1] and PLAIN.dp_ranks is None
    assert WorkerCard.from_json(RANKED.to_json()).data_parallel_size == 2
    assert list(WorkerCard("x", "a", ModelCard("m", "/tmp"), data_parallel_start_rank=4,
                           data_parallel_size=2).dp_ranks or ()) == [4, 5]


def test_each_rank_is_a_candidate_and_the_answer_names_the_worker_and_its_rank():
    router = Router(lambda m: [RANKED, PLAIN])  # round-robin: each target in turn
    seen = [route(router, f"r{i}") for i in range(3)]
    assert [(r.worker_id, r.dp_rank if r.HasField("dp_rank") else None) for r in seen] == [
        ("dp", 0), ("dp", 1), ("solo", None)]
    assert router.bookings.in_flight("dp@dp0") == 1 and router.bookings.in_flight("dp@dp1") == 1


def test_kv_events_index_each_rank_apart_and_a_repeated_prompt_goes_to_the_rank_holding_it():
    tokens = list(range(1000, 1000 + 8 * BS))
    ingest = synced_ingest("dp@dp0", "dp@dp1")
    assert ingest.on_message(stored("dp", 1, 1, tokens)) is Verdict.APPLIED
    # The other rank's stream is its own: its seq 1 is not a duplicate of rank 1's.
    assert ingest.on_message(stored("dp", 0, 1, list(range(5000, 5000 + 2 * BS)))) is Verdict.APPLIED
    assert ingest.index.worker_blocks("dp@dp1") == 8 and ingest.index.worker_blocks("dp@dp0") == 2
    router = build_router(lambda m: [RANKED], "kv", ingest=ingest)
    response = asyncio.run(router.route(router_pb2.RouteRequest(
        request_id="r", model="m", prompt_tokens=len(tokens), block_hashes=block_hashes(tokens, BS), explain=True)))
    assert (response.worker_id, response.dp_rank, response.overlap_blocks) == ("dp", 1, 8)
    by_rank = {c.dp_rank: c.overlap_blocks for c in response.decision.candidates}
    assert by_rank == {0: 0, 1: 8} and {c.worker_id for c in response.decision.candidates} == {"dp"}


def test_load_reports_count_per_rank():
    ingest = synced_ingest("dp@dp0", "dp@dp1")
    msg = stored("dp", 0, 1, list(range(BS)))
    msg["load"] = {"active_blocks": 7, "waiting": 1, "running": 2, "total_blocks": 100}
    ingest.on_message(msg)
    assert ingest.loads["dp@dp0"].active_blocks == 7 and "dp@dp1" not in ingest.loads


def test_a_dp_rank_pin_routes_to_that_rank_of_any_worker_and_of_a_pinned_one():
    router = Router(lambda m: [RANKED, PLAIN])
    for i in range(4):
        r = route(router, f"a{i}", dp_rank=1)
        assert (r.worker_id, r.dp_rank) == ("dp", 1)
    assert route(router, "b", dp_rank=0, worker_id="solo").worker_id == "solo"  # no ranks: rank 0
    r = route(router, "c", worker_id="dp", dp_rank=0)
    assert (r.worker_id, r.dp_rank) == ("dp", 0)


def test_a_worker_pin_without_a_rank_takes_the_least_loaded_rank():
    router = Router(lambda m: [RANKED])
    first, second = route(router, "a", worker_id="dp"), route(router, "b", worker_id="dp")
    assert {first.dp_rank, second.dp_rank} == {0, 1}


@pytest.mark.parametrize("pins, fragment", [
    ({"dp_rank": 5}, "rank 5, which no worker serving model `m` has"),
    ({"dp_rank": 2, "worker_id": "dp"}, "rank 2, which worker dp does not have (its ranks: 0, 1)"),
    ({"dp_rank": 1, "worker_id": "solo"}, "rank 1, which worker solo does not have (its ranks: 0)"),
])
def test_a_rank_that_does_not_exist_where_it_is_pinned_is_a_400_naming_the_field(pins, fragment):
    with pytest.raises(InvalidRequest) as e:
        route(Router(lambda m: [RANKED, PLAIN]), "r", **pins)
    assert e.value.param == "nvext.dp_rank" and fragment in e.value.message


def test_busy_ranks_drop_out_one_by_one_and_a_leaving_worker_takes_every_rank_with_it():
    router = Router(lambda m: [RANKED], busy=BusyThreshold(1))
    assert {route(router, "a").dp_rank, route(router, "b").dp_rank} == {0, 1}
    router.on_worker_change("dp", RANKED)
    router.on_worker_change("dp", None)
    assert router.bookings.in_flight("dp@dp0") == 0 and router.bookings.in_flight("dp@dp1") == 0


def test_a_migration_excludes_every_rank_of_the_failed_worker():
    router = Router(lambda m: [RANKED, PLAIN])
    for i in range(4):
        assert route(router, f"m{i}", exclude_worker_ids=["dp"]).worker_id == "solo"
