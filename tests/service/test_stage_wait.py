"""Calls to a stage wait out its restart (services/common/stage_wait.py), and readiness says when it stays away.

Real gRPC servers on loopback ports play the router (a servicer scripted per test: the client is what
is under test) and are stopped and started again on the same port, as `meshfront run` restarts a
killed process. Issue 23: a restarting router or preprocessor failed every request for 1-3 s with a
503 naming its address, while /health stayed 200.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from meshfront.common.v1 import common_pb2
from meshfront.postprocessor.v1 import postprocessor_pb2, postprocessor_pb2_grpc
from meshfront.router.v1 import router_pb2, router_pb2_grpc

from services.common.errors import NoWorkers, StageUnavailable, from_rpc_error
from services.common.grpc_server import GrpcServer
from services.gateway import models_api
from services.gateway.postprocessor_mux import MuxPostprocessor
from services.gateway.router_replicas import ReplicaRouters
from services.gateway.stage_watch import POLL_S, StageWatch
from services.launcher.plan import free_port
from services.postprocessor.router_client import GrpcRouterClient

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]


class Router(router_pb2_grpc.RouterServiceServicer):
    """Answers Route with its ``name`` as the address; ``hold`` keeps calls waiting; ``error`` is raised;
    ``closing_s``: for that long after the first call, every call fails as on a connection that is closing
    (UNAVAILABLE without our ErrorInfo), while the channel stays READY."""

    def __init__(self, name: str, hold: bool = False, error: Exception | None = None, closing_s: float = 0.0):
        self.name = name
        self.hold = hold
        self.error = error
        self.closing_s = closing_s
        self.calls = 0
        self.call_times: list[float] = []
        self.arrived = asyncio.Event()

    async def Route(self, request, context):
        self.calls += 1
        self.call_times.append(time.monotonic())
        self.arrived.set()
        if self.call_times[-1] - self.call_times[0] < self.closing_s:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "GOAWAY received")
        if self.error is not None:
            raise self.error
        if self.hold:
            await asyncio.Event().wait()
        return router_pb2.RouteResponse(address=self.name, worker_id="w")


async def _serve(servicer: Router, port: int) -> GrpcServer:
    server = GrpcServer("router", "127.0.0.1", port, grace_s=0)
    router_pb2_grpc.add_RouterServiceServicer_to_server(servicer, server.server)
    await server.start()
    return server


def _route(rid: str = "r1") -> router_pb2.RouteRequest:
    return router_pb2.RouteRequest(request_id=rid, model="m")


async def test_a_request_waits_for_a_stage_that_comes_up_within_the_wait():
    port = free_port()
    client = ReplicaRouters(f"127.0.0.1:{port}", wait_s=10)
    call = asyncio.create_task(client.route(_route()))
    await asyncio.sleep(1.0)  # the router is down (restarting): the request must not have failed
    assert not call.done()
    server = await _serve(Router("second"), port)
    try:
        assert (await asyncio.wait_for(call, 10)).address == "second"
    finally:
        await server.stop()
        await client.close()


async def test_a_call_its_stage_died_under_is_sent_again_once_the_stage_is_back():
    port = free_port()
    first = Router("first", hold=True)
    server = await _serve(first, port)
    client = ReplicaRouters(f"127.0.0.1:{port}", wait_s=10)
    second = Router("second")
    try:
        call = asyncio.create_task(client.route(_route()))
        await asyncio.wait_for(first.arrived.wait(), 10)
        await server.server.stop(0)  # the router dies with the call in flight
        await asyncio.sleep(0.3)
        server = await _serve(second, port)
        assert (await asyncio.wait_for(call, 10)).address == "second"
        assert (first.calls, second.calls) == (1, 1)
    finally:
        await server.stop()
        await client.close()


@pytest.mark.parametrize("client_of", [ReplicaRouters, GrpcRouterClient], ids=["router replicas", "StageCaller"])
async def test_sends_that_fail_on_a_connection_still_reading_ready_are_spaced_not_spent_in_a_burst(client_of):
    """The flake of test_a_call_its_stage_died_under_is_sent_again_once_the_stage_is_back, made deterministic: the
    dying router's connection fails every call for a moment while the channel reads READY. Sent again at once, the
    request spent its three sends in a few milliseconds and was a 503; with the backoff the last one is sent after
    the connection is through (stage_wait.py, RETRY_BACKOFF_S). The gateway's router replicas and every
    StageCaller (the postprocessor's Route, the gateway's Preprocess) take the pause."""
    port = free_port()
    router = Router("after the burst", closing_s=0.5)
    server = await _serve(router, port)
    client = client_of(f"127.0.0.1:{port}", wait_s=10)
    try:
        assert (await asyncio.wait_for(client.route(_route()), 10)).address == "after the burst"
        assert router.calls == 3
        gaps = [b - a for a, b in zip(router.call_times, router.call_times[1:], strict=False)]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # doubled, from RETRY_BACKOFF_S = 0.25 (less the timer's slack)
    finally:
        await server.stop()
        await client.close()


class ClosingPostprocessor(postprocessor_pb2_grpc.PostprocessorServiceServicer):
    """For ``closing_s`` after its first stream, every stream is cut as a server that is stopping cuts them
    (UNAVAILABLE, no ErrorInfo) while its connection stays up, the channel reading READY; then each start is
    answered with one finishing response."""

    def __init__(self, closing_s: float):
        self.closing_s = closing_s
        self.stream_times: list[float] = []

    async def GenerateStream(self, request_iterator, context):
        self.stream_times.append(time.monotonic())
        async for action in request_iterator:
            if self.stream_times[-1] - self.stream_times[0] < self.closing_s:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "Cancelling all calls")
            response = postprocessor_pb2.GenerateResponse(text="served", finish_reason=common_pb2.FINISH_REASON_STOP)
            yield postprocessor_pb2.GenerateStreamResponse(
                chunks=[postprocessor_pb2.GenerateStreamChunk(id=action.start.id, response=response)])


async def test_a_postprocessor_stream_lost_on_a_closing_connection_is_sent_again_spaced_not_in_a_burst():
    """CI's flake of test_resume_on_replica_loss.py's one-replica restart, made deterministic: the replica cut the
    streams, and the new ones went on its closing connection (GOAWAY received) twice within milliseconds; the
    request spent its sends and failed. Spaced, the last send comes after the connection is through."""
    port = free_port()
    replica = ClosingPostprocessor(closing_s=0.5)
    server = GrpcServer("postprocessor", "127.0.0.1", port, grace_s=0)
    postprocessor_pb2_grpc.add_PostprocessorServiceServicer_to_server(replica, server.server)
    await server.start()
    client = MuxPostprocessor(f"127.0.0.1:{port}", wait_s=10)
    try:
        req = postprocessor_pb2.GenerateRequest(worker_address="127.0.0.1:1", worker_id="w")
        req.request.request_id = "r"
        got = [r.text async for batch in client.generate(req) for r in batch]
        assert got == ["served"]
        assert len(replica.stream_times) == 3
        gaps = [b - a for a, b in zip(replica.stream_times, replica.stream_times[1:], strict=False)]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # RETRY_BACKOFF_S, doubled (less the timer's slack)
    finally:
        await client.close()
        await server.stop()


async def test_a_stage_that_stays_away_past_the_wait_is_a_503_with_a_fixed_text():
    client = ReplicaRouters(f"127.0.0.1:{free_port()}", wait_s=0.5)
    started = time.monotonic()
    with pytest.raises(StageUnavailable) as info:
        await client.route(_route())
    assert 0.5 <= time.monotonic() - started < 5
    assert info.value.message == "the router is unavailable" and info.value.http_status == 503
    await client.close()


async def test_the_stage_s_own_error_is_not_sent_again():
    port = free_port()
    router = Router("r", error=NoWorkers("no worker serves model m"))
    server = await _serve(router, port)
    client = ReplicaRouters(f"127.0.0.1:{port}", wait_s=5)
    try:
        with pytest.raises(NoWorkers, match="no worker serves model m"):
            await client.route(_route())
        assert router.calls == 1
    finally:
        await server.stop()
        await client.close()


async def test_grpc_s_own_failure_text_never_reaches_the_client():
    port = free_port()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router_pb2_grpc.RouterServiceStub(channel).Route(_route(), timeout=5)
    assert f"127.0.0.1:{port}" in info.value.details()  # what gRPC says: the address, the socket error
    err = from_rpc_error(info.value)
    assert err.http_status == 503 and err.message == "a service this request needs is unavailable"


async def test_health_is_503_naming_a_stage_unreachable_past_the_wait_and_200_once_it_is_back():
    port = free_port()
    client = ReplicaRouters(f"127.0.0.1:{port}", wait_s=0.5)
    watch = StageWatch({"router": client.unreachable}, grace_s=0.5)
    models = {"m": ["a worker"]}
    deadline = time.monotonic() + 10
    while not watch.poll() and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    ready, body = models_api.health(models, unavailable=watch.unavailable)  # type: ignore[arg-type]
    assert not ready
    assert body["status"] == "unavailable" and body["unavailable"] == ["router"]
    assert body["message"] == "the router is unavailable" and str(port) not in str(body)
    server = await _serve(Router("back"), port)
    try:
        deadline = time.monotonic() + 10
        while watch.poll() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        assert models_api.health(models, unavailable=watch.unavailable)[0]  # type: ignore[arg-type]
    finally:
        await server.stop()
        await client.close()


async def test_a_postprocessor_replica_away_for_the_grace_makes_the_stage_unavailable_until_it_is_back():
    """The multiplexed client's channels (pick-first) cycle through failing, idle and connecting while the
    replica is away: the watch must still see it unreachable for the whole grace."""
    port = free_port()
    client = MuxPostprocessor(f"127.0.0.1:{port}", wait_s=0.5)
    watch = StageWatch({"postprocessor": client.unreachable}, grace_s=1.5)
    deadline = time.monotonic() + 10
    while not watch.poll() and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    assert watch.unavailable == ["postprocessor"]
    server = await _serve(Router("any server on the port"), port)  # a connection is all the watch asks for
    try:
        deadline = time.monotonic() + 10
        while watch.poll() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        assert watch.unavailable == []
    finally:
        await server.stop()
        await client.close()


async def test_a_router_replica_with_a_call_open_gets_no_new_one_while_another_has_none():
    """router_replicas.py: the fewest open Route calls first, so a replica that fell behind is not queued on."""
    slow, fast = Router("slow", hold=True), Router("fast")
    servers = [await _serve(slow, free_port()), await _serve(fast, free_port())]
    client = ReplicaRouters("ipv4:" + ",".join(f"127.0.0.1:{s.port}" for s in servers), wait_s=5)
    calls = []
    try:
        for i in range(6):
            calls.append(asyncio.create_task(client.route(_route(f"r{i}"))))
            await asyncio.sleep(0.1)
        assert slow.calls == 1
        answered = [c.result().address for c in calls if c.done()]
        assert answered == ["fast"] * 5
    finally:
        for c in calls:
            c.cancel()
        await client.close()
        for s in servers:
            await s.stop()


async def test_a_router_named_by_dns_is_resolved_into_its_replicas():
    port = free_port()
    server = await _serve(Router("by name"), port)
    client = ReplicaRouters(f"dns:///localhost:{port}", wait_s=5)
    try:
        assert (await asyncio.wait_for(client.route(_route()), 10)).address == "by name"
    finally:
        await client.close()
        await server.stop()
