"""The gateway's gRPC health follows its stages (issue 23: /health and readiness stayed 200 while every
request got a 503), and its liveness does not.

The gateway is built as its process builds it (services/gateway/assembly.py) and served on a real
port; its preprocessor, router and postprocessor targets point at one port where nothing listens at
first, then a server does (the watch asks only for a connection). No NATS: warm-up gives up waiting for
a discovery view after its (shortened) waits, as a gateway of an empty mesh does.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.discovery import WorkerRegistry
from services.common.grpc_server import GrpcServer
from services.gateway import warmup
from services.gateway.assembly import LIVENESS_SERVICE, build
from services.gateway.config import parse_config
from services.launcher.plan import free_port

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(stub, service: str = "") -> int:
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


async def _until(stub, want: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while await _status(stub) != want:
        assert time.monotonic() < deadline, f"gRPC health never became {want}"
        await asyncio.sleep(0.1)


async def test_grpc_health_is_not_serving_while_a_stage_is_away_and_liveness_stays_serving(monkeypatch):
    monkeypatch.setattr(warmup, "SYNC_WAIT_S", 0.2)
    monkeypatch.setattr(warmup, "EMPTY_WAIT_S", 0.2)
    stages = f"127.0.0.1:{free_port()}"
    cfg = parse_config(["--port", "0", "--preprocessor", stages, "--router", stages, "--postprocessor", stages,
                        "--stage-wait-s", "0.5", "--nats-url", f"nats://127.0.0.1:{free_port()}"])
    gateway = build(cfg, WorkerRegistry(cfg.nats_url, "gateway"))
    server = GrpcServer("gateway", "127.0.0.1", 0)
    gateway.service.add_to(server)
    gateway.start()
    await server.start()
    stand_in = None
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await _until(stub, NOT_SERVING)
            await asyncio.sleep(1.5)  # warm-up has given up by now; the stages are still away
            assert await _status(stub) == NOT_SERVING
            assert gateway.service.stages.unavailable == ["preprocessor", "router", "postprocessor"]
            assert await _status(stub, LIVENESS_SERVICE) == SERVING
            stand_in = GrpcServer("stages", "127.0.0.1", int(stages.rsplit(":", 1)[1]))
            await stand_in.start()
            await _until(stub, SERVING)
            assert gateway.service.stages.unavailable == []
    finally:
        if stand_in is not None:
            await stand_in.stop()
        await server.stop()
        await gateway.close()
