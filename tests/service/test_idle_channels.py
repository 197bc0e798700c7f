"""An idle mesh connection is closed, and readiness does not open it again at every poll (issue 40, item 1).

A mesh server closes a connection with no call for ``grpc.max_connection_idle_ms`` (grpc_server.py): an idle
process then has no per-connection timers (keepalive) waking it. The gateway's stage watch (stage_watch.py,
over ``stage_wait.Reachability``) must take such an IDLE channel for reachable without reconnecting it at
every poll, and still find a stage that went away. A real grpc.aio server plays the stage, closing idle
connections after 1 s instead of the mesh's 15.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common import stage_wait
from services.common.grpc_server import PINGED_CHANNEL_OPTIONS, SERVER_OPTIONS
from services.gateway.stage_watch import POLL_S, StageWatch
from tests.frozen_proxy import FrozenProxy

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

IDLE = grpc.ChannelConnectivity.IDLE
READY = grpc.ChannelConnectivity.READY


async def _stage() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=[*(o for o in SERVER_OPTIONS if o[0] != "grpc.max_connection_idle_ms"),
                                      ("grpc.max_connection_idle_ms", 1_000)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _poll_until(watch: StageWatch, done: Callable[[], bool], timeout_s: float) -> list[list[str]]:
    """Polls as the gateway's watch does until ``done()``; every verdict on the way."""
    verdicts: list[list[str]] = []
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not done in {timeout_s} s: {verdicts[-5:]}"
        verdicts.append(watch.poll())
        await asyncio.sleep(POLL_S)
    return verdicts


async def test_an_idle_channel_stays_idle_and_reachable_until_its_stage_stops():
    server, address = await _stage()
    channel = grpc.aio.insecure_channel(address, options=PINGED_CHANNEL_OPTIONS)
    reach = stage_wait.Reachability(channel, check_every_s=3.0)
    watch = StageWatch({"router": reach.unreachable}, grace_s=0.5)
    try:
        # Not reached yet: the watch has it connect.
        await _poll_until(watch, lambda: watch.unavailable == [] and channel.get_state() is READY, 10)
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())  # a request went through
        # The server closes the connection a second after the last call, and polls do not open it again.
        await _poll_until(watch, lambda: channel.get_state() is IDLE, 5)
        states = []
        for _ in range(int(1.5 / POLL_S)):
            assert watch.poll() == []  # idle by the server's timer: its last connection was fine
            states.append(channel.get_state())
            await asyncio.sleep(POLL_S)
        assert set(states) == {IDLE}, states
        # Past check_every_s the watch has it connect once more, and it is closed again after.
        await _poll_until(watch, lambda: channel.get_state() is READY, 5)
        await _poll_until(watch, lambda: channel.get_state() is IDLE, 5)
        # Stopped while the gateway was idle: the next check finds it, and after the grace it is unavailable.
        await server.stop(0)
        verdicts = await _poll_until(watch, lambda: watch.unavailable == ["router"], 10)
        assert [] in verdicts  # reachable until the check, not at once: nothing told the idle channel
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_request_on_a_channel_closed_for_idleness_reconnects_and_is_answered_every_time():
    """StageCaller's wait covers the reconnect (an IDLE channel is not connected, so the call waits for it), and
    the server closes every quiet connection, not only the first (the client's own idle timeout did once)."""
    server, address = await _stage()
    caller = stage_wait.StageCaller(grpc.aio.insecure_channel(address, options=PINGED_CHANNEL_OPTIONS), "router", 5)
    stub = health_pb2_grpc.HealthStub(caller.channel)
    try:
        for _ in range(2):
            answer = await caller.call(lambda: stub.Check(health_pb2.HealthCheckRequest()))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            deadline = time.monotonic() + 5
            while caller.channel.get_state() is not IDLE:
                assert time.monotonic() < deadline, caller.channel.get_state()
                await asyncio.sleep(0.1)
    finally:
        await caller.channel.close()
        await server.stop(0)


async def test_a_call_to_a_peer_that_froze_while_its_connection_was_closed_fails_within_seconds():
    """A frozen peer (SIGSTOP, a wedged host) accepts the TCP connection in its kernel and never answers the
    HTTP/2 handshake. With the connection closed for idleness the next call must connect, and gRPC's default
    bound on that is 20 s; pinged channels give up after 2 s (min_reconnect_backoff_ms), as a ping on a
    connected channel would, so that the caller moves the request to another replica within seconds."""
    server, address = await _stage()
    proxy = FrozenProxy(address)
    await proxy.start()
    channel = grpc.aio.insecure_channel(proxy.address, options=PINGED_CHANNEL_OPTIONS)
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        await stub.Check(health_pb2.HealthCheckRequest())
        deadline = time.monotonic() + 5
        while channel.get_state() is not IDLE:
            assert time.monotonic() < deadline, channel.get_state()
            await asyncio.sleep(0.1)
        proxy.freeze()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(stub.Check(health_pb2.HealthCheckRequest()), 10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
        await proxy.close()
        await server.stop(0)
