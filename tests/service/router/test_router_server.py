"""The router's gRPC server on 127.0.0.1:0 with a fixed worker table."""

import grpc
import pytest
from meshfront.router.v1 import router_pb2, router_pb2_grpc

from services.common.discovery import ModelCard, WorkerCard
from services.common.errors import ModelNotFound, from_rpc_error
from services.common.grpc_server import GrpcServer
from services.router.core.policies import build_policy
from services.router.metrics import RouterMetrics
from services.router.server import RouterServicer
from services.router.service import Router

pytestmark = pytest.mark.service

WORKERS = [WorkerCard(f"w{i}", f"127.0.0.1:{9500 + i}", ModelCard("m", "/models/m")) for i in range(2)]


@pytest.fixture
async def stub():
    router = Router(lambda model: [w for w in WORKERS if w.model.name == model], build_policy("least-loaded"))
    server = GrpcServer("router", "127.0.0.1", 0)
    metrics = RouterMetrics()  # its own registry: each test counts from zero
    router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(router, metrics.route_duration), server.server)
    await server.start()
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield router_pb2_grpc.RouterServiceStub(ch), router, metrics
    await server.stop()


async def test_route_calls_are_timed(stub):
    s, _, metrics = stub
    for rid in ("a", "b", "c"):
        await s.Route(router_pb2.RouteRequest(request_id=rid, model="m", prompt_tokens=10))
    assert metrics.registry.get_sample_value("meshfront_router_route_duration_seconds_count") == 3


async def test_route_books_and_release_frees(stub):
    s, router, _ = stub
    a = await s.Route(router_pb2.RouteRequest(request_id="a", model="m", prompt_tokens=10))
    b = await s.Route(router_pb2.RouteRequest(request_id="b", model="m", prompt_tokens=10))
    assert {a.worker_id, b.worker_id} == {"w0", "w1"}  # least-loaded spreads
    assert a.address.startswith("127.0.0.1:")
    await s.Release(router_pb2.ReleaseRequest(request_id="a"))
    assert router.bookings.in_flight(a.worker_id) == 0 and router.bookings.in_flight(b.worker_id) == 1


async def test_pin_wins_in_any_mode(stub):
    s, _, _ = stub
    for i in range(3):
        r = await s.Route(router_pb2.RouteRequest(request_id=f"p{i}", model="m", worker_id="w1"))
        assert r.worker_id == "w1"


async def test_unknown_model_is_not_found_with_our_error_info(stub):
    s, _, _ = stub
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.Route(router_pb2.RouteRequest(request_id="x", model="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    err = from_rpc_error(e.value)
    assert isinstance(err, ModelNotFound) and err.param == "model"


async def test_releases_riding_on_a_route_free_their_bookings_first():
    """A worker full at --max-in-flight-per-worker 1 takes the next request when its release rides along."""
    from services.common.errors import Overloaded
    from services.common.overload import BusyThreshold

    router = Router(lambda model: [w for w in WORKERS[:1] if w.model.name == model], build_policy("round-robin"),
                    busy=BusyThreshold(1))
    await router.route(router_pb2.RouteRequest(request_id="a", model="m", prompt_tokens=1))
    with pytest.raises(Overloaded):
        await router.route(router_pb2.RouteRequest(request_id="b", model="m", prompt_tokens=1))
    routed = await router.route(router_pb2.RouteRequest(
        request_id="b", model="m", prompt_tokens=1, releases=[router_pb2.ReleaseRequest(request_id="a")]))
    assert routed.worker_id == "w0" and router.bookings.in_flight("w0") == 1
    await router.release_batch(router_pb2.ReleaseBatchRequest(releases=[router_pb2.ReleaseRequest(request_id="b")]))
    assert router.bookings.in_flight("w0") == 0
