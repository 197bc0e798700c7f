"""--router-min-initial-workers (DYN_ROUTER_MIN_INITIAL_WORKERS) in the router process's own assembly and serving
glue (main.py), over a real NATS and gRPC: NOT_SERVING and Route held until enough workers registered."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from meshfront.router.v1 import router_pb2, router_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common.discovery import ModelCard, Registrar, WorkerCard, WorkerRegistry
from services.common.grpc_server import GrpcServer
from services.router.assembly import build
from services.router.config import parse_config
from services.router.main import SPEC
from tests.conftest import wait_for

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

SERVING = health_pb2.HealthCheckResponse.SERVING


def registrar(nats_url: str, i: int) -> Registrar:
    return Registrar(nats_url, WorkerCard(f"w{i}", f"127.0.0.1:{9100 + i}", ModelCard("m", "/m")))


async def health(channel: grpc.aio.Channel) -> int:
    return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))).status


async def test_the_router_serves_only_once_the_minimum_of_workers_registered(nats_url):
    cfg = parse_config(["--nats-url", nats_url], env={"DYN_ROUTER_MIN_INITIAL_WORKERS": "2"})
    assert cfg.router_min_initial_workers == 2
    registry = WorkerRegistry(nats_url, "router-test")
    built = build(cfg, registry, CollectorRegistry())
    server = GrpcServer("router", "127.0.0.1", 0)
    SPEC.serve(built, server)
    built.start()
    await registry.start()
    await server.start()
    workers = [registrar(nats_url, i) for i in range(2)]
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = router_pb2_grpc.RouterServiceStub(ch)
            assert await health(ch) != SERVING
            call = asyncio.ensure_future(stub.Route(router_pb2.RouteRequest(request_id="r", model="m")))
            await workers[0].start()
            await wait_for(lambda: len(registry.workers_for("m")) == 1, 15, "the first card")
            await asyncio.sleep(0.3)
            assert not call.done() and await health(ch) != SERVING  # one of two: still held
            await workers[1].start()
            assert (await asyncio.wait_for(call, 15)).worker_id in ("w0", "w1")
            await wait_for(lambda: built.service.gate.is_open, 5, "the gate")
            deadline = asyncio.get_running_loop().time() + 5
            while await health(ch) != SERVING:
                assert asyncio.get_running_loop().time() < deadline, "health never turned SERVING"
                await asyncio.sleep(0.05)
            await workers[0].close()  # the gate is for start-up only: a worker leaving does not close it
            await wait_for(lambda: len(registry.workers_for("m")) == 1, 15, "w0 gone")
            routed = await asyncio.wait_for(stub.Route(router_pb2.RouteRequest(request_id="r2", model="m")), 5)
            assert routed.worker_id == "w1" and await health(ch) == SERVING
    finally:
        await server.stop()
        await built.close()
        await registry.close()
        for w in workers:
            await w.close()


def test_a_negative_minimum_is_a_bad_value():
    with pytest.raises(ValueError, match="--router-min-initial-workers -1 must be >= 0"):
        parse_config(["--router-min-initial-workers", "-1"], env={})


def test_no_minimum_serves_at_once():
    cfg = parse_config([], env={})
    assert cfg.router_min_initial_workers == 0
