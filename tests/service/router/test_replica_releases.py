"""Router replicas share only what their decisions read, and the gateway sends each release back to the
replica that booked it (services/gateway/router_replicas.py, services/router/events.py).

Real routers behind real gRPC servers on loopback ports, their replica sync over a real NATS server, and
the gateway's own router client in front: what is under test is that no booking leaks on any replica and
that a round-robin fleet sends nothing over NATS, while every booking a decision elsewhere reads is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from meshfront.router.v1 import router_pb2, router_pb2_grpc
from prometheus_client import Histogram

from services.common import stage_wait
from services.common.discovery import ModelCard, WorkerCard
from services.common.grpc_server import GrpcServer
from services.gateway.router_replicas import ReplicaRouters
from services.launcher.plan import free_port
from services.router.assembly import build_router
from services.router.events import ReplicaSync
from services.router.server import RouterServicer
from services.router.service import Router
from tests.conftest import wait_for
from tests.frozen_proxy import FrozenProxy

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

CARDS = [WorkerCard(f"w{i}", f"127.0.0.1:{i + 1}", ModelCard("m", "/m", block_size=16)) for i in range(2)]
_DURATION = Histogram("test_replica_route_seconds", "route duration in this test")


class Replica:
    def __init__(self, router: Router, sync: ReplicaSync, server: GrpcServer):
        self.router, self.sync, self.server = router, sync, server

    @property
    def booked(self) -> int:
        return len(self.router.bookings)


@contextlib.asynccontextmanager
async def replicas(nats_url: str, mode: str, n: int = 2) -> AsyncIterator[tuple[list[Replica], ReplicaRouters]]:
    started: list[Replica] = []
    try:
        for _ in range(n):
            router = build_router(lambda _m: CARDS, mode)
            sync = ReplicaSync(nats_url, router.apply)
            await sync.start()
            router.listeners.append(sync)
            server = GrpcServer("router", "127.0.0.1", free_port(), grace_s=0)
            router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(router, _DURATION), server.server)
            await server.start()
            started.append(Replica(router, sync, server))
        client = ReplicaRouters("ipv4:" + ",".join(f"127.0.0.1:{r.server.port}" for r in started), wait_s=5)
        try:
            for channel in [r.channel for r in client._set.replicas.values()]:  # else turns skip one still connecting
                assert await stage_wait.wait_connected(channel, 5)
            yield started, client
        finally:
            await client.close()
    finally:
        for r in started:
            await r.server.stop()
            await r.sync.close()


def route(rid: str, **fields) -> router_pb2.RouteRequest:
    return router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=16, **fields)


async def test_a_round_robin_fleet_shares_nothing_and_every_release_reaches_its_booker(nats_url):
    async with replicas(nats_url, "round-robin") as (fleet, client):
        for i in range(8):
            await client.route(route(f"r{i}"))
        assert [r.booked for r in fleet] == [4, 4]  # turns over the replicas, and nothing shared
        for i in range(8):
            await client.release(router_pb2.ReleaseRequest(request_id=f"r{i}"))
        await wait_for(lambda: [r.booked for r in fleet] == [0, 0], 10, "every booking released where it was made")
        assert [r.sync.messages_received for r in fleet] == [0, 0]


async def test_a_session_s_booking_is_shared_and_so_is_its_release(nats_url):
    async with replicas(nats_url, "round-robin") as (fleet, client):
        await client.route(route("plain"))
        await client.route(route("s1", session_id="chat-1", session_timeout_s=60))
        await wait_for(lambda: all("s1" in r.router.bookings for r in fleet), 10, "the session's booking on both")
        assert sorted(r.booked for r in fleet) == [1, 2]  # the plain one only where it was routed
        assert fleet[0].router.sessions.worker_for("chat-1") == fleet[1].router.sessions.worker_for("chat-1")
        for rid in ("plain", "s1"):
            await client.release(router_pb2.ReleaseRequest(request_id=rid))
        await wait_for(lambda: [r.booked for r in fleet] == [0, 0], 10, "both released")


async def test_a_load_reading_policy_shares_every_booking(nats_url):
    async with replicas(nats_url, "least-loaded") as (fleet, client):
        for i in range(4):
            await client.route(route(f"r{i}"))
            # Each booking reaches the other replica before the next route (the share is by NATS: on a loaded
            # machine a route sent at once could come before it, and that replica would see a worker idle).
            await wait_for(lambda n=i + 1: [r.booked for r in fleet] == [n, n], 10, f"booking {i} on both replicas")
        # Shared load: the four went two to each worker, whichever replica routed them.
        assert sorted(fleet[0].router.bookings.in_flight(c.worker_id) for c in CARDS) == [2, 2]
        for i in range(4):
            await client.release(router_pb2.ReleaseRequest(request_id=f"r{i}"))
        await wait_for(lambda: [r.booked for r in fleet] == [0, 0], 10, "every release on both replicas")


async def test_a_migration_routed_by_another_replica_is_released_on_both(nats_url):
    async with replicas(nats_url, "round-robin") as (fleet, client):
        first = await client.route(route("m1"))
        booker, other = sorted(fleet, key=lambda r: -r.booked)
        assert (booker.booked, other.booked) == (1, 0)
        # The postprocessor's Route for the migration lands on the other replica (its channel round-robins).
        moved = await other.router.route(route("m1", exclude_worker_ids=[first.worker_id]))
        assert moved.worker_id != first.worker_id
        await wait_for(lambda: booker.router.bookings.in_flight(moved.worker_id) == 1, 10,
                       "the migration's booking replacing the first one")
        assert booker.router.bookings.in_flight(first.worker_id) == 0
        await client.release(router_pb2.ReleaseRequest(request_id="m1"))  # to the replica that booked it first
        await wait_for(lambda: [r.booked for r in fleet] == [0, 0], 10, "the release on both")


async def test_a_replica_that_died_is_passed_over_and_its_bookings_are_released_nowhere_else(nats_url):
    async with replicas(nats_url, "round-robin") as (fleet, client):
        await client.route(route("a"))
        await client.route(route("b"))
        assert [r.booked for r in fleet] == [1, 1]
        await fleet[0].server.stop()
        for i in range(4):  # every one answered, by the replica left
            assert (await client.route(route(f"c{i}"))).worker_id
        assert fleet[1].booked == 5
        for rid in ("a", "b", "c0", "c1", "c2", "c3"):
            await client.release(router_pb2.ReleaseRequest(request_id=rid))
        await wait_for(lambda: fleet[1].booked == 0, 10, "the live replica's bookings released")


async def test_a_frozen_replica_s_calls_go_to_another_within_seconds(nats_url):
    """A replica that stops answering but keeps its connection (SIGSTOP, a wedged host) is found out by
    the channel's pings (PINGED_CHANNEL_OPTIONS): its calls fail over in about 3 s, not after TCP's
    or a 20 s keepalive's minutes."""
    async with replicas(nats_url, "round-robin") as (fleet, _):
        proxy = FrozenProxy(f"127.0.0.1:{fleet[0].server.port}")
        await proxy.start()
        client = ReplicaRouters(f"ipv4:{proxy.address},127.0.0.1:{fleet[1].server.port}", wait_s=5)
        try:
            for channel in [r.channel for r in client._set.replicas.values()]:
                assert await stage_wait.wait_connected(channel, 5)
            await client.route(route("before"))
            await client.route(route("before-2"))
            assert [r.booked for r in fleet] == [1, 1]  # both replicas took calls through their paths
            proxy.freeze()
            answers = await asyncio.wait_for(asyncio.gather(*(client.route(route(f"f{i}")) for i in range(4))), 10)
            assert all(a.worker_id for a in answers)
            assert [r.booked for r in fleet] == [1, 5]  # the frozen one never saw them
        finally:
            await client.close()
            await proxy.close()
