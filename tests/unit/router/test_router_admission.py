"""Router admission: migrating requests exclude failed workers; busy workers are skipped or overload."""

from __future__ import annotations

import asyncio

import pytest
from meshfront.router.v1 import router_pb2

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import NoWorkers, Overloaded
from services.common.overload import BusyThreshold
from services.router.core.policies import build_policy
from services.router.service import Router

pytestmark = pytest.mark.unit

CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{9000 + i}", ModelCard("m", "/tmp")) for i in range(3)]


def route(router, rid: str, exclude=()):
    return asyncio.run(router.route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=4,
                                                            exclude_worker_ids=list(exclude))))


def test_excluded_workers_are_never_chosen_and_excluding_all_fails():
    router = Router(lambda model: CARDS, build_policy("round-robin"))
    for i in range(6):
        assert route(router, f"r{i}", exclude=["w0", "w2"]).worker_id == "w1"
    with pytest.raises(NoWorkers):
        route(router, "rx", exclude=["w0", "w1", "w2"])


def test_a_migration_rebooks_the_same_request_instead_of_adding_a_booking():
    router = Router(lambda model: CARDS, build_policy("least-loaded"))
    first = route(router, "r1").worker_id
    second = route(router, "r1", exclude=[first]).worker_id
    assert second != first
    assert router.bookings.in_flight(first) == 0 and router.bookings.in_flight(second) == 1


def test_busy_workers_are_skipped_and_a_full_fleet_is_overloaded():
    router = Router(lambda model: CARDS, build_policy("round-robin"), busy=BusyThreshold(2))
    chosen = [route(router, f"r{i}").worker_id for i in range(6)]
    assert sorted(chosen) == ["w0", "w0", "w1", "w1", "w2", "w2"]
    with pytest.raises(Overloaded):
        route(router, "r6")
    asyncio.run(router.release(router_pb2.ReleaseRequest(request_id="r0")))
    assert route(router, "r7").worker_id == chosen[0]
